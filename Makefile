# kube-ddp developer entry points. `make demo` and `make test` are the README's two commands;
# everything they need is installed here: uv (pinned, into a cache outside the repo), then the
# workspace into .venv. The control plane binaries are built by hack/dev-cluster.py.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CACHE_DIR ?= $(HOME)/.cache/kube-ddp
UV_VERSION := 0.13.8
UV_HOME := $(CACHE_DIR)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
export UV  # the benchmarks install the operator as its image does (benchmarks/contenders.py)
export UV_CACHE_DIR ?= $(CACHE_DIR)/uv-cache
export KUBEDDP_CACHE_DIR ?= $(CACHE_DIR)
export UV_PYTHON_DOWNLOADS := never
# .pyc files written at install: a process that may not write them (the dev node's pods, which
# mount .venv read-only, or a shell with PYTHONDONTWRITEBYTECODE) otherwise compiles torch's
# sources at every start, 2 to 3 times its import time.
export UV_COMPILE_BYTECODE := 1
VENV := .venv
PY := $(VENV)/bin/python
SYNCED := $(VENV)/.synced

.PHONY: help venv check test test-serial soak soak-node test-kind lint fmt crds manifests demo bench release-check cluster-build cluster-up cluster-down cluster-status clean

help:
	@echo "make demo            run the example job locally: 2 CPU workers (digits), no download"
	@echo "make check           lint + the tests that need no cluster, no torch process and no"
	@echo "                     network (tests/unit less those marked trainer): under a minute"
	@echo "make test            lint + all test tiers (unit, trainer, cluster, e2e), in two sessions"
	@echo "                     side by side, the second on a cluster of its own"
	@echo "make test-serial     the same tiers in one session, on one cluster (slower)"
	@echo "make soak            faults at random on many kwok jobs for SOAK_MINUTES (30), SOAK_JOBS (60)"
	@echo "                     at once; SOAK_SEED replays a run (its short form is in make test)"
	@echo "make soak-node       faults at random on real trainer jobs on the real node for SOAK_MINUTES"
	@echo "                     (15), SOAK_JOBS (3) at once; SOAK_SEED replays a run"
	@echo "make test-kind       on kind (podman, a local node image): docs/install.md's kind lines,"
	@echo "                     then the e2e tier (about 20 min and 20 GB of disk; not in make test)"
	@echo "make lint            ruff, mypy (strict: both packages and hack/devcluster), the layers"
	@echo "                     (lint-imports), hadolint, actionlint"
	@echo "make crds            regenerate the CRD (manifests/ and the chart's crds/) from the API models"
	@echo "make manifests       crds + the chart's generated files + manifests/install.yaml"
	@echo "make release-check   every release step that does not push: version, chart, operator image"
	@echo "                     (TRAINER_IMAGE=1: the CPU trainer image too, about 6 GB)"
	@echo "make bench           benchmarks, the operator beside Kubeflow's (results: docs/BENCHMARKS.md)"
	@echo "make cluster-up      start the local control plane (etcd, apiserver, kwok, ...)"
	@echo "make cluster-down    stop it; make cluster-status shows it"
	@echo "make cluster-build   build the control plane binaries (cached in $(CACHE_DIR))"

$(UV):
	python3 -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

venv: $(SYNCED)
$(SYNCED): $(UV) pyproject.toml uv.lock operator/pyproject.toml trainer_image/pyproject.toml
	@echo "make venv: installing .venv from uv.lock (torch and the tools: minutes the first time)"
	$(UV) sync --quiet --frozen --all-packages --python python3
	touch $@

uv.lock: pyproject.toml operator/pyproject.toml trainer_image/pyproject.toml | $(UV)
	$(UV) lock --python python3
	touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy operator/kube_ddp trainer_image/ddp_trainer trainer_image/horovod
	$(VENV)/bin/mypy --strict hack/devcluster
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(VENV)/bin/hadolint Dockerfile trainer_image/Dockerfile trainer_image/torch-cpu.Dockerfile
	$(PY) hack/dev-cluster.py tool actionlint .github/workflows/*.yaml

fmt: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Every commit's check (CONTRIBUTING.md): the unit tier less its tests that start torch
# processes (marked trainer); what needs a cluster or a node lives in other tiers.
check: lint
	$(PY) -m pytest -q tests/unit -m "not (trainer or cluster or e2e)"

# Every tier, in two pytest sessions side by side (tests/lanes.py), the second on a cluster of
# its own; the 30 slowest tests of each are listed at the end, so each CI log says where the
# tiers' time went.
test: lint
	$(PY) -m tests.lanes --durations=30

# Every tier in one pytest session (one cluster): slower, for reading one log in order.
test-serial: lint
	$(PY) -m pytest --durations=30

# The soak's long form (tests/cluster/soak.py); SOAK_RESULTS: where its figures go (JSON).
soak: venv
	SOAK_MINUTES=$${SOAK_MINUTES:-30} SOAK_JOBS=$${SOAK_JOBS:-60} \
	SOAK_RESULTS=$${SOAK_RESULTS:-docs/benchmarks-soak.json} \
	$(PY) -m pytest -s -p no:cacheprovider --timeout=0 tests/cluster/test_soak.py

# The soak on the real node (tests/e2e/soak_node.py): real trainer jobs with checkpoints.
soak-node: venv
	SOAK_NODE=1 SOAK_MINUTES=$${SOAK_MINUTES:-15} SOAK_JOBS=$${SOAK_JOBS:-3} \
	SOAK_RESULTS=$${SOAK_RESULTS:-docs/benchmarks-soak-node.json} \
	$(PY) -m pytest -s -p no:cacheprovider --timeout=0 tests/e2e/test_soak_node.py

# On kind with Podman (tests/kind): docs/install.md's kind lines, then the e2e tier as the
# GitHub workflow runs it. About 20 minutes and 20 GB of disk: not part of `make test`.
test-kind: venv
	KUBEDDP_KIND=1 $(PY) -m pytest tests/kind

crds: venv
	$(VENV)/bin/kube-ddp crd > manifests/crd.yaml
	cp manifests/crd.yaml charts/kube-ddp/crds/ddptrainingjobs.kubeddp.io.yaml

# Chart.yaml (version), _rules.tpl (RBAC), schema descriptions, the chart README's values table
# and manifests/install.yaml (helm template, with the dev cluster's helm: make cluster-build).
manifests: crds
	$(PY) hack/chart.py write

# The README's first command: the example job file, run on this machine the way a cluster runs
# it. kube-ddp builds the operator's two worker pods and runs them as local processes wired by
# the env contract (gloo on CPU, scikit-learn's bundled 8x8 digits: nothing is downloaded),
# decides restarts and the end by the operator's rules, and shows what the trainer reports.
DEMO_JOB := manifests/examples/digits-cpu.yaml
demo: venv
	$(VENV)/bin/kube-ddp run --local $(DEMO_JOB)

# What .github/workflows/release.yaml does on a tag, without pushing (hack/release.py check):
# the version check, helm lint and package with the dev cluster's helm, the operator image built
# with buildah (amd64) and the packaged chart rendered with it pinned by digest.
release-check: venv
	$(PY) hack/release.py check $(if $(TRAINER_IMAGE),--trainer-image)

# matplotlib (the plots) is in the bench dependency group only: `uv run` adds it to .venv.
bench: venv
	$(UV) run --frozen --all-packages --group bench python -m benchmarks all --peers --repeats 3

cluster-build cluster-up cluster-down cluster-status: venv
	$(PY) hack/dev-cluster.py $(@:cluster-%=%)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
