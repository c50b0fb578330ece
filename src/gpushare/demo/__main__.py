"""``python -m gpushare.demo up|down|status`` (``make demo``): a local GPU-sharing cluster.

* ``up`` starts the demo cluster (``gpushare.demo.cluster``) in the background, showing its
  progress; applies the examples (``examples/*.yaml``; those in gpu-manager's and HAMi's request
  dialects only with ``--dialects``, which the chart's defaults do not serve either); waits
  until each example pod is placed or refused; prints where they went, why the others wait,
  and ``kubectl inspect gpushare -d``; and leaves the cluster running with a kubeconfig to play
  with, printing the commands to use it as they run from a fresh shell (``.venv/bin/...``, the
  kubectl binary's full path). A second ``up`` finds it running and only shows it.
* ``status`` shows whether it runs, its kubeconfig and ``kubectl inspect gpushare``.
* ``down`` stops it (SIGTERM; every component stops, nothing is left behind).

The state lives in ``--dir`` (default ``out/demo`` of the repository): ``state.json`` while it
runs, ``demo.log``, ``kubeconfig`` and the components' ``logs/``. Test-and-demo code: it runs
the project's test control plane (``gpushare.testing``), not part of the runtime packages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from gpushare.core.policies import policy_names
from gpushare.demo.cluster import DEFAULT_POLICY, KUBECONFIG, read_state, serve
from gpushare.demo.examples import (
    DIALECT_EXAMPLES,
    apply_examples,
    describe,
    files_of,
    outcome,
)
from gpushare.testing.controlplane import REPO_ROOT, gpushare_argv

DEFAULT_DIR = REPO_ROOT / "out" / "demo"
SERVE = (sys.executable, "-m", "gpushare.demo", "serve")
START_TIMEOUT_S = 600.0


def _directory(option: Path | None) -> Path:
    return (option or DEFAULT_DIR).resolve()


dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the demo keeps its state, kubeconfig and logs (default: out/demo).",
)


@click.group()
def demo() -> None:
    """A local GPU-sharing cluster from gpushare's real components (kwok nodes with GPUs)."""


policy_option = click.option(
    "--policy",
    type=click.Choice(policy_names()),
    default=DEFAULT_POLICY,
    show_default=True,
    help="The extender's placement policy (binpack: the examples land as docs/usage.md says).",
)


real_node_option = click.option(
    "--real-node",
    is_flag=True,
    help="Add a real kubelet + containerd node with gpushare device-plugin over fake GPUs and "
    "run the binpack example on it (needs root and make node-runtime).",
)


dialects_option = click.option(
    "--dialects",
    is_flag=True,
    help="Also serve the request dialects of gpu-manager and HAMi and apply their examples, as "
    "the chart does with devicePlugin.dialects and scheduler.dialectResources set (off by "
    "default, as in the chart: docs/compute.md).",
)


@demo.command()
@dir_option
@policy_option
@real_node_option
@dialects_option
def up(directory: Path | None, policy: str, real_node: bool, dialects: bool) -> None:
    """Start the demo cluster, apply the examples, show where they went."""
    folder = _directory(directory)
    state = read_state(folder)
    if state is None:
        state = _start(folder, policy, real_node, dialects)
    else:
        click.echo(f"The demo runs already (PID {state['pid']}).")
        asked = {"real_node": real_node, "dialects": dialects}
        for flag, key, what in (("--real-node", "real_node", "no real node"),
                                ("--dialects", "dialects", "the dialects off")):  # fmt: skip
            if asked[key] and not state.get(key):
                raise click.ClickException(
                    f"the running demo has {what}; stop it (make demo-down) and start it "
                    f"again with {flag}"
                )
    from lightkube import Client, KubeConfig  # noqa: PLC0415 (after the cluster is up)
    from lightkube.core.exceptions import ApiError  # noqa: PLC0415

    config = KubeConfig.from_file(state["kubeconfig"])
    with Client(config, field_manager="gpushare-demo") as kube:
        files = files_of(dialects=bool(state.get("dialects")))
        click.echo(f"Applying {', '.join(files)}, one at a time ...")
        try:
            created, settled = apply_examples(kube, files)
        except ApiError as error:
            raise click.ClickException(f"applying the examples failed: {error}") from None
        click.echo(f"Created {len(created)} objects.")
        if not settled:
            click.echo("Some example pods were neither placed nor refused within 120 s.")
        click.echo("\nThe example pods:")
        click.echo(describe(outcome(kube)))
        if not state.get("dialects"):
            click.echo(_dialects_off())
        if state.get("real_node"):
            _run_on_real_node(kube)
        click.echo(f"\n$ {_script('gpushare')} inspect -d     # kubectl inspect gpushare -d")
        detail = _inspect(state, "-d")
        click.echo(detail)
        if "STATE" in detail:
            click.echo(_STATES)
    _next_steps(state)


def _dialects_off() -> str:
    """Why the dialect examples were left out, and how to see them placed."""
    return (
        f"\n{' and '.join(DIALECT_EXAMPLES)} were left out: their pods ask the request dialects "
        "of gpu-manager and HAMi,\nwhich the chart serves only when told to "
        "(devicePlugin.dialects, scheduler.dialectResources;\ndocs/compute.md), and this demo "
        "runs the chart's defaults. To see them placed: make demo-down, then\n"
        f"  {_script('python')} -m gpushare.demo up --dialects"
    )


_STATES = (
    "STATE (shown while a pod on the node is not yet assigned): assigned, the device plugin has "
    "given its\ncontainers their GPUs; starting, bound with its GPUs chosen, the device plugin "
    "not done yet;\nunplaced, bound without an allocation. The kwok nodes have no device plugin: "
    'the demo records their\npods as started the way it does (docs/inspect.md, "Reading -d").'
)


def _run_on_real_node(kube: Any) -> None:
    """The binpack example's pods run on the real node; the GPU variables they print."""
    from gpushare.demo.realnode import (  # noqa: PLC0415 (only with a real node)
        REAL_NODE,
        apply_real_examples,
        real_outcome,
    )
    from gpushare.testing.controlplane import ControlPlaneError  # noqa: PLC0415

    click.echo(f"\nRunning the binpack example's pods on the real node {REAL_NODE} ...")
    try:
        names = apply_real_examples(kube)
        click.echo("Their containers print (kubectl logs):")
        click.echo(real_outcome(kube, names))
    except ControlPlaneError as error:
        raise click.ClickException(f"on the real node: {error}") from None


def _start(folder: Path, policy: str, real_node: bool, dialects: bool) -> dict[str, Any]:
    """Start ``serve`` detached and follow its log until it is ready (or fails)."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "demo.log"
    offset = log_path.stat().st_size if log_path.exists() else 0  # this start's lines follow
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*SERVE, "--dir", str(folder), "--policy", policy]
            + (["--real-node"] if real_node else [])
            + (["--dialects"] if dialects else []),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this command
        )
    click.echo(f"Starting the demo cluster (log: {log_path}) ...")
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        offset = _show_new(log_path, offset)
        state = read_state(folder)
        if state is not None and state.get("pid") == process.pid:
            return state
        if process.poll() is not None:
            _show_new(log_path, offset)
            raise click.ClickException(
                f"the demo cluster did not start (exit {process.returncode}); its log: {log_path}"
            )
        if time.monotonic() > deadline:
            process.terminate()
            raise click.ClickException(
                f"the demo cluster was not ready within {START_TIMEOUT_S:.0f} s; log: {log_path}"
            )
        time.sleep(0.5)


def _show_new(path: Path, offset: int) -> int:
    try:
        data = path.read_bytes()
    except OSError:
        return offset
    for line in data[offset:].decode(errors="replace").splitlines():
        if line.startswith("[demo]"):
            click.echo("  " + line.removeprefix("[demo] "))
    return len(data)


def _inspect(state: dict[str, Any], *args: str) -> str:
    argv = [*gpushare_argv("inspect", *args), "--kubeconfig", state["kubeconfig"]]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr).rstrip()


def _script(name: str) -> str:
    """The console script ``name`` of this interpreter's environment as a command that runs
    from a fresh shell in the current directory (``.venv/bin/gpushare`` from the repository):
    relative when it lies below the current directory, else absolute; ``name`` alone when this
    environment has no such script."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        return name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _next_steps(state: dict[str, Any]) -> None:
    """The commands to use the running cluster, each as it runs from a fresh shell in the
    repository (no PATH change needed): the kubectl it was built with and this environment's
    console scripts by their paths, ``--dir`` when the demo's folder is not the default."""
    kubectl = state.get("kubectl", "kubectl")
    gpushare = _script("gpushare")
    python = _script("python")
    folder = Path(state["kubeconfig"]).parent
    where = "" if folder == DEFAULT_DIR.resolve() else f" --dir {folder}"
    stop = "make demo-down" if not where else f"{python} -m gpushare.demo down{where}"
    folders = [Path(kubectl).parent.resolve(), Path(sys.executable).parent.resolve()]
    tools = os.pathsep.join(dict.fromkeys(map(str, folders)))
    click.echo(
        "\nThe cluster keeps running. To use it, from a shell in this directory:\n"
        f"  export KUBECONFIG={state['kubeconfig']}\n"
        f"  {kubectl} get pods -A -o wide\n"
        f"  {gpushare} inspect -d        # what kubectl inspect gpushare -d prints\n"
        f"  {gpushare} inspect --web     # the GPU map on http://127.0.0.1:8089/\n"
        f"  {python} -m gpushare.demo status{where}\n"
        f'  export PATH="{tools}:$PATH"   # then plain kubectl and kubectl inspect gpushare\n'
        "  pods with schedulerName: gpushare-scheduler go through the extender\n"
        f"Stop it with: {stop}"
    )


@demo.command()
@dir_option
def status(directory: Path | None) -> None:
    """Whether the demo runs; its kubeconfig and the GPU summary."""
    folder = _directory(directory)
    state = read_state(folder)
    if state is None:
        click.echo(f"The demo is not running ({folder}).")
        raise SystemExit(3)
    minutes = (time.time() - float(state["started"])) / 60
    click.echo(f"The demo runs (PID {state['pid']}, up {minutes:.0f} min).")
    click.echo(f"KUBECONFIG={state['kubeconfig']}")
    click.echo(_inspect(state))


@demo.command()
@dir_option
def down(directory: Path | None) -> None:
    """Stop the demo cluster and remove its kubeconfig (left over from a demo that died too;
    its certificates are gone with the control plane)."""
    folder = _directory(directory)
    state = read_state(folder)
    if state is None:
        _remove_kubeconfig(folder)
        click.echo("The demo is not running.")
        return
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while read_state(folder) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    if read_state(folder) is not None:
        raise click.ClickException(f"the demo (PID {pid}) did not stop within 60 s")
    _remove_kubeconfig(folder)
    click.echo("The demo cluster stopped.")


def _remove_kubeconfig(folder: Path) -> None:
    """Remove the demo's kubeconfig in ``folder``, saying so when there was one."""
    path = folder / KUBECONFIG
    if path.is_file():
        path.unlink()
        click.echo(f"Removed {path} (its cluster is gone).")


@demo.command(hidden=True)
@dir_option
@policy_option
@real_node_option
@dialects_option
def serve_command(directory: Path | None, policy: str, real_node: bool, dialects: bool) -> None:
    """Run the demo cluster in the foreground (what ``up`` starts in the background)."""
    serve(_directory(directory), policy, real_node=real_node, dialects=dialects)


serve_command.name = "serve"


def main() -> None:
    demo.main(prog_name="python -m gpushare.demo")


if __name__ == "__main__":
    main()
