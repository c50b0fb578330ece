"""Pack the real-node path for a lent GPU machine into ``.gpu-bundle/`` (docs/testing.md,
"Real GPU node"; what goes in and why: :mod:`gpushare.testing.gpubundle`).

Run: ``.venv/bin/python bench/gpu/pack.py`` (after ``make controlplane containerd
node-runtime``), or ``--plan`` to print the split from the files' sizes without compressing.
It installs gpushare's runtime dependencies for Python 3.12 (cp312 manylinux x86_64, the
versions of constraints.txt; needs pip's index, once: ``.gpu-bundle/site`` is reused), checks
that every binary is stripped, writes each bundle as ``tar`` + ``xz -9``
(``gpu-node-K-of-N.tar.xz``, each with ``manifest/<its name>.json`` inside), prints each
bundle's size and fails when one is over what a call carries beside the checkout.
``.gpu-bundle/`` goes into ``.git/info/exclude``: the device tool sends a bundle only when its
``carry`` names it. Compressing about 410 MB takes minutes here (2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpushare.testing.controlplane import REPO_ROOT, Binaries, ControlPlaneError
from gpushare.testing.gpubundle import (
    RUNTIME_WHEELS,
    Bundle,
    BundleError,
    call_limit_mib,
    fewest_calls,
    node_items,
    plan_bundles,
    repository_mib,
    stripped,
)
from gpushare.testing.node.prerequisites import containerd_dir

OUT = REPO_ROOT / ".gpu-bundle"
EXCLUDE_LINE = "/.gpu-bundle/"
PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux1_x86_64",
)  # fmt: skip


def pinned(names: tuple[str, ...], constraints: Path) -> list[str]:
    """``name==version`` for each of ``names`` from constraints.txt (names compared as pip
    does: case and ``-``/``_`` alike)."""

    def key(name: str) -> str:
        return name.lower().replace("_", "-")

    pins = {}
    for line in constraints.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            pins[key(name)] = f"{name}=={version}"
    absent = [n for n in names if key(n) not in pins]
    if absent:
        raise BundleError(f"{constraints}: no pin for {', '.join(absent)}")
    return [pins[key(n)] for n in names]


def install_site(site: Path) -> Path:
    """gpushare's runtime wheels (:data:`RUNTIME_WHEELS`) for cp312 installed into ``site``;
    reused while the pins are the same."""
    requirements = pinned(RUNTIME_WHEELS, REPO_ROOT / "constraints.txt")
    stamp = site / ".requirements"
    if stamp.is_file() and stamp.read_text().split() == requirements:
        return site
    shutil.rmtree(site, ignore_errors=True)
    argv = [
        sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
        "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
        *(f"--platform={p}" for p in PLATFORMS), "--target", str(site), *requirements,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundleError(f"pip could not install the cp312 wheels: {done.stderr[-2000:]}")
    stamp.write_text("\n".join(requirements) + "\n")
    return site


def exclude_from_git() -> None:
    """Add :data:`EXCLUDE_LINE` to ``.git/info/exclude`` once."""
    exclude = REPO_ROOT / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if EXCLUDE_LINE not in lines:
        with exclude.open("a") as out:
            out.write(f"{EXCLUDE_LINE}\n")


def write_bundle(bundle: Bundle, count: int, out: Path) -> Path:
    """``bundle`` as ``out/<name>``: a staging tree of links, ``tar -h`` through ``xz -9``."""
    stage = out / ".stage"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "manifest").mkdir(parents=True)
    for item in bundle.items:
        link = stage / item.dest
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(item.source.resolve())
    manifest = {
        "name": bundle.name,
        "bundles": count,
        "groups": list(bundle.groups),
        "files": {item.dest: item.size_bytes for item in bundle.items},
    }
    (stage / "manifest" / f"{bundle.name}.json").write_text(json.dumps(manifest, indent=1))
    target = out / bundle.name
    partial = target.with_suffix(".partial")
    with partial.open("wb") as sink:
        tar = subprocess.Popen(["tar", "-C", str(stage), "-chf", "-", "."], stdout=subprocess.PIPE)
        xz = subprocess.run(["xz", "-9", "-T0", "-c"], stdin=tar.stdout, stdout=sink, check=False)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or xz.returncode != 0:
            raise BundleError(f"tar | xz failed for {bundle.name}")
    partial.rename(target)
    shutil.rmtree(stage)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", action="store_true", help="print the split; compress nothing")
    parser.add_argument("--out", type=Path, default=OUT, help="where the bundles go")
    args = parser.parse_args()
    try:
        site = args.out / "site" if args.plan else install_site(args.out / "site")
        runc = Path(shutil.which("runc") or "/usr/sbin/runc")
        items = node_items(
            controlplane_dir=Binaries.locate().directory,
            containerd_dir=containerd_dir(),
            runc=runc,
            cni_dir=Path("/usr/lib/cni"),
            busybox=Path("/bin/busybox"),
            site_dir=site,
        )
        unstripped = [str(i.source) for i in items if i.dest.startswith("bin/")
                      and not stripped(i.source)]  # fmt: skip
        if unstripped:
            raise BundleError(f"not stripped: {', '.join(unstripped)} (strip them first)")
        repo = repository_mib(REPO_ROOT)
        limit = call_limit_mib(repo)
        bundles = plan_bundles(items, limit_mib=limit)
        fewest = fewest_calls(items, limit_mib=limit)
        print(f"checkout {repo:.1f} MiB; a bundle may weigh {limit:.1f} MiB beside it; "
              f"{len(bundles)} bundle(s), fewest possible {fewest}")  # fmt: skip
        for bundle in bundles:
            print(f"  {bundle.name}: {', '.join(bundle.groups)}; {bundle.raw_mib:.1f} MiB raw, "
                  f"~{bundle.estimate_mib:.1f} MiB estimated")  # fmt: skip
            for item in bundle.items:
                print(f"    {item.dest:28} {item.size_bytes / 2**20:8.1f} MiB  {item.source}")
        if args.plan:
            return 0
        exclude_from_git()
        args.out.mkdir(parents=True, exist_ok=True)
        for old in args.out.glob("gpu-node-*.tar.xz"):
            old.unlink()
        over = []
        for bundle in bundles:
            written = write_bundle(bundle, len(bundles), args.out)
            size_mib = written.stat().st_size / 2**20
            print(f"{written}: {size_mib:.1f} MiB")
            if size_mib > limit:
                over.append(f"{bundle.name} ({size_mib:.1f} MiB)")
        if over:
            raise BundleError(f"over the {limit:.1f} MiB a call carries: {', '.join(over)}")
    except (BundleError, ControlPlaneError) as error:
        print(f"pack: {error}", file=sys.stderr)
        return 1
    total = sum(p.stat().st_size for p in args.out.glob("gpu-node-*.tar.xz")) / 2**20
    print(f"total {total:.1f} MiB; one bundle a call (docs/testing.md, 'Real GPU node')")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
