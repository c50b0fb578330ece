"""Cluster tier: one real control plane (etcd, kube-apiserver, kube-scheduler, kwok) per session.

The binaries come from ``make controlplane`` (``scripts/build-controlplane.sh``). If they are
missing the session fixture errors out with instructions: cluster tests are never skipped.
When a test fails, the tail of every control-plane log, and of every other log under the
plane's directory written while the test ran (extender replicas, device plugins), is attached
to its report; the full logs are copied to pytest's temporary directory
(``.../controlplane-logs0``) at the end.
"""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator

import pytest
from lightkube import Client

from gpushare.testing.controlplane import Binaries, ControlPlane


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's control plane; stopped (every process, every temp file) at the end."""
    binaries = Binaries.locate()
    with ControlPlane(binaries, log_dir=tmp_path_factory.mktemp("controlplane-logs")) as plane:
        yield plane


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Client]:
    """An admin lightkube client; checks first that every control-plane process still runs."""
    control_plane.check_running()
    with control_plane.client() as client:
        yield client


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        plane = getattr(item, "funcargs", {}).get("control_plane")
        if isinstance(plane, ControlPlane):
            for name, text in plane.logs().items():
                report.sections.append((f"control plane: {name} (last lines)", text))
            for path, text in plane.logs_written_since(call.start).items():
                report.sections.append((f"{path} (last lines)", text))
    return report


@pytest.fixture(autouse=True)
def _collect_garbage() -> Iterator[None]:
    """Collect garbage after each test: a resource it leaked (an unclosed socket, transport or
    file, a ResourceWarning that ``filterwarnings = error`` fails) is then reported by its own
    teardown, not by whichever later test the garbage collector happened to run in."""
    yield
    gc.collect()
