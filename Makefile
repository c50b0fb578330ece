# gpushare — one-command set-up: `make run` (the simulator on the embedded default) and
# `make test` (ruff, mypy --strict and the whole pytest suite). Both create .venv on first use.
# `make demo` starts a local GPU-sharing cluster to play with.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The exact versions every install here (CI's too) and the image's take: scripts/constraints.py.
CONSTRAINTS := constraints.txt

.PHONY: run demo demo-real-node demo-down test lint typecheck pytest bench bench-extender bench-deviceplugin bench-scheduling bench-failover bench-inspect bench-metrics bench-preemption bench-replay bench-scale clean controlplane node-runtime observe-tools helm schedconfig image manifests constraints containerd native bench-share-view

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --constraint $(CONSTRAINTS) -e '.[sim,test]' \
		|| { echo "pip refused pyproject.toml's ranges with $(CONSTRAINTS)'s pins: run make constraints" >&2; exit 1; }
	touch $(STAMP)

# Move the pins: upgrade .venv to the newest versions pyproject.toml's ranges allow and write
# them to constraints.txt (scripts/constraints.py; `make test` checks the two agree with what is
# installed). Then run `make test` and commit constraints.txt with pyproject.toml.
constraints:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --upgrade --upgrade-strategy eager -e '.[sim,test]'
	$(BIN)/python scripts/constraints.py
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gpushare simulate --out out/simulate

# A local GPU-sharing cluster (kwok GPU nodes, the extender, a second kube-scheduler) with the
# examples of examples/ applied; it keeps running: `make demo-down` stops it.
demo: $(STAMP) controlplane
	$(BIN)/python -m gpushare.demo up

# The same with a real kubelet + containerd node (fake GPUs) running the binpack example (root).
demo-real-node: $(STAMP) controlplane node-runtime containerd
	$(BIN)/python -m gpushare.demo up --real-node

demo-down: $(STAMP)
	$(BIN)/python -m gpushare.demo down

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

controlplane:
	scripts/heartbeat.sh controlplane scripts/build-controlplane.sh

# runc, CNI plugins, busybox-static, iptables for the real-node tier (tests/node); containerd: below.
node-runtime:
	scripts/install-node-runtime.sh

observe-tools:
	scripts/install-observe-tools.sh

# containerd 2.x from the Go module proxy (testenv/containerd), for the real-node DRA tests: CDI.
containerd:
	scripts/heartbeat.sh containerd scripts/build-containerd.sh

helm:
	scripts/build-helm.sh

# The scheduler configuration API of Kubernetes 1.23 and 1.24 (testenv/schedconfig), which the
# deploy tests decode deploy/scheduler/kube-scheduler-config-v1beta{2,3}.yaml with.
schedconfig:
	scripts/build-schedconfig.sh

# The gpushare image from the Dockerfile, no registry, no Docker engine (buildah on a base made
# from Debian's packages): out/image/gpushare-<version>.tar for `ctr -n k8s.io images import`.
image:
	scripts/build-image.sh

# libgpushare-share.so, the share view preloaded into shared containers (docs/share-view.md):
# build/native/, compiled with the machine's cc (Debian's gcc is installed when missing).
native:
	scripts/build-native.sh

manifests: helm
	scripts/render-manifests.sh

pytest: $(STAMP) controlplane node-runtime containerd observe-tools helm schedconfig image native
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/simulate.py

bench-extender: $(STAMP)
	$(BIN)/python bench/extender.py

bench-deviceplugin: $(STAMP) controlplane
	$(BIN)/python bench/deviceplugin.py

bench-inspect: $(STAMP)
	$(BIN)/python bench/inspect_report.py

bench-metrics: $(STAMP)
	$(BIN)/python bench/metrics_scrape.py

# The share view library's cost per intercepted call against the stub drivers (no GPU needed).
bench-share-view: $(STAMP)
	$(BIN)/python bench/share_view.py

bench-scheduling: $(STAMP) controlplane
	$(BIN)/python bench/scheduling.py

bench-failover: $(STAMP) controlplane
	$(BIN)/python bench/failover.py

# GPU-aware preemption against kube-scheduler's own: 100 kwok nodes x 8 GPUs full of
# low-priority pods, 200 high-priority pods (docs/usage.md, "Priorities and preemption").
bench-preemption: $(STAMP) controlplane
	$(BIN)/python bench/preemption.py --json out/bench/preemption.json

# The simulator against kube-scheduler + the extender on the same pods (out/replay/replay.png).
bench-replay: $(STAMP) controlplane
	$(BIN)/python bench/replay.py --out out/replay

# The profilers (py-spy, pyinstrument) for benchmark work; not needed by `make test`.
$(VENV)/.bench-installed: $(STAMP)
	$(BIN)/pip install --quiet --constraint $(CONSTRAINTS) -e '.[bench]'
	touch $@

# 5,000 nodes x 8 GPUs and 50,000 GPU pods (docs/extender.md, "5,000 nodes"):
# filter/prioritize latency against the canned floor, /inspect, the extender's RSS and cold
# start with every object in a real API server, and kube-scheduler throughput over 5,000 kwok
# nodes (1,000 pods a round). About 30 minutes on the 2-core development machine.
SCALE_NODES ?= 5000
SCALE_PODS  ?= 50000
bench-scale: $(VENV)/.bench-installed controlplane
	uptime
	$(BIN)/python bench/extender.py --nodes $(SCALE_NODES) --pods $(SCALE_PODS) --rounds 5
	$(BIN)/python bench/extender.py --nodes $(SCALE_NODES) --pods $(SCALE_PODS) --rounds 5 --window 500
	$(BIN)/python bench/inspect_report.py --nodes $(SCALE_NODES) --pods $(SCALE_PODS) --rounds 5
	$(BIN)/python bench/scale.py --nodes $(SCALE_NODES) --pods $(SCALE_PODS)
	$(BIN)/python bench/scheduling.py --nodes $(SCALE_NODES) --pods 1000 --rounds 3 --budget 0.9
	uptime

clean:
	rm -rf $(VENV) out .mypy_cache .pytest_cache .ruff_cache
