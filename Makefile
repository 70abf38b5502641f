# The user's front door. Everything installs into .venv/ at the repo root (idempotently).
# A venv on Debian's /usr/bin/python3 with system site-packages, so Debian's mininet imports too.
# setuptools' notice about editable installs is silenced by its text (it is advice, not a problem).

SHELL := /bin/bash
PYTHON_SYS := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
TESTBED := $(VENV)/bin/testbed
TOPO ?= 2dc-1000km
NAME ?=
BACKEND ?= netns
# Package names differ by distribution only in the stock kernel's image (tested: Debian 12 here; Debian 13 and
# Ubuntu 22.04/24.04 by the CI workflow in .github/workflows/test.yml). Ubuntu 22.04's python3 is 3.10: 3.11 is
# taken from its python3.11 packages.
OS_ID := $(shell . /etc/os-release 2>/dev/null && echo $$ID)
OS_VERSION := $(shell . /etc/os-release 2>/dev/null && echo $$VERSION_ID)
KERNEL_IMAGE := $(if $(filter ubuntu,$(OS_ID)),linux-image-generic,linux-image-amd64)
ifeq ($(OS_ID)-$(OS_VERSION),ubuntu-22.04)
PYTHON_SYS := /usr/bin/python3.11
PYTHON_PKGS := python3.11 python3.11-venv python3.11-dev
else
PYTHON_PKGS := python3-venv python3-dev
endif
APT_PACKAGES := iproute2 iptables iputils-ping iperf3 bridge-utils mininet openvswitch-switch net-tools tmux \
	$(PYTHON_PKGS) qemu-system-x86 $(KERNEL_IMAGE) busybox-static openssh-server git \
	rdma-core ibverbs-utils perftest python3-pyverbs
STAMP := $(VENV)/.installed

.PHONY: demo demo-real demo-profile demo-paper congestion install apt stock-kernel test test-host test-unit multihost vm-test vm-test-remote lint up down status plan doctor bench-up bench-links bench-pipeline bench-backends bench-verify bench-soak bench-transport bench-schedules-transport breakdown bench-yardstick bench-repro bench-replay bench-overhead cli clean

install: $(STAMP) stock-kernel

# The stock-kernel tier's 7.x kernel (rxe inside namespaces), from Debian's trixie-backports without touching the
# system's apt sources; idempotent. On other distributions it says why it is skipped.
stock-kernel: | apt
	@scripts/install-stock-kernel.sh

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "apt: installing $$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "apt packages missing ($$missing): run 'sudo make install'" >&2; exit 1; fi; \
	  fresh_sshd=$$(echo "$$missing" | grep -qx openssh-server && echo y); guard=; \
	  if [ -n "$$fresh_sshd" ] && [ ! -e /usr/sbin/policy-rc.d ]; then guard=/usr/sbin/policy-rc.d; \
	    printf '#!/bin/sh\nexit 101\n' > $$guard && chmod +x $$guard; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  status=$$?; [ -z "$$guard" ] || rm -f $$guard; \
	  if [ -n "$$fresh_sshd" ] && [ -d /run/systemd/system ]; then systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true; fi; \
	  exit $$status; \
	fi

$(STAMP): pyproject.toml | apt
	test -x $(PY) || $(PYTHON_SYS) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	PYTHONWARNINGS='ignore:Editable installation:UserWarning' $(PY) -m pip install -q -e '.[dev,train]'
	touch $(STAMP)

# Every tier this machine can run: unit + root + mininet on the host, then the stock-kernel tier in QEMU. Under CI
# (CI=true) a tier that cannot run fails the target instead of being skipped. PYTEST_ARGS passes options to pytest
# (the workflow writes junit XML with it).
PYTEST_ARGS ?=
test: test-host
	@if $(TESTBED) vm --check >/dev/null 2>&1; then $(MAKE) --no-print-directory vm-test; \
	elif [ "$$CI" = true ]; then echo "stock-kernel tier cannot run under CI: $$($(TESTBED) vm --check 2>&1)" >&2; exit 1; \
	else echo "stock-kernel tier skipped: $$($(TESTBED) vm --check 2>&1)"; fi

test-host: install
	$(PY) -m pytest $(PYTEST_ARGS)

# Tests marked `vm`, inside Debian's stock kernel (netem, rdma_rxe) under QEMU, via virtme-ng.
vm-test: install
	$(TESTBED) vm --timeout 3600 --out results/vm -- $(PY) -m pytest -p no:cacheprovider -m vm \
		--junitxml=results/vm/junit-vm.xml tests/test_vm.py tests/test_vm_rdma.py

# The SSH lab inside the stock kernel: `testbed remote`'s cycle trains over RDMA between "machines" (rxe per
# namespace) and over TCP, and leaves no rxe device. Not in vm-test: under TCG on 2 cores it takes about an hour
# (playbooks/README "Tested where").
vm-test-remote: install
	$(TESTBED) vm --timeout 5400 --memory 4G --out results/vm -- $(PY) -m pytest -p no:cacheprovider -m vm -s \
		--junitxml=results/vm/junit-vm-remote.xml tests/test_vm_remote_rdma.py

# The same experiment on real machines over SSH: preflight -> provision -> shape -> verify -> run -> collect ->
# teardown (playbooks/README.md). INVENTORY names the machines; ARGS passes run options (e.g. --schedule 1f1b,geopipe).
multihost: install
	@test -n "$(INVENTORY)" || { echo "usage: make multihost INVENTORY=path/to/inventory.yaml [ARGS='--schedule 1f1b,geopipe']" >&2; exit 2; }
	$(TESTBED) remote cycle $(INVENTORY) $(ARGS)

test-unit: install
	$(PY) -m pytest -m "not root and not vm and not mininet and not multihost"

lint: install
	$(VENV)/bin/ruff check testbed workloads tests bench playbooks
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	@# The docs, strictly (a broken link or anchor, or a page left out of mkdocs.yml's nav, fails); built into a
	@# temporary folder, so no site/ is left in the tree. Not -q: mkdocs 1.6 then stops counting warnings.
	site=$$(mktemp -d) && { $(VENV)/bin/mkdocs build --strict --site-dir "$$site"; status=$$?; rm -rf "$$site"; exit $$status; }

# The main job: GeoPipe's experiment in its regime (docs/paper.md), the short figure set: Llama 2 13B on 8 nodes of
# 8 Ascend 910B (TP 8 inside a node) over three regions, 256Ki tokens per step, each schedule at the shape the planner
# chose for it, spine 400 and 25 Gb/s at 3000 km in slow motion, the model beside every point and over the whole
# spine range; then the small GPT trained for real on the same links (this host's regime). About 13 minutes on 2
# cores. QUICK=1: the first look at real arithmetic in about 15 s (ExperimentSpec.quick: 1000 km against 0 km).
demo: install
	$(if $(QUICK),$(TESTBED) experiment --quick $(DEMO_ARGS),$(TESTBED) paper 3dc-8stages \
		--compute $(or $(PROFILE),llama2-13b-910b-tp8) --spines 400,25 --distances 3000 $(DEMO_ARGS))

# The real-arithmetic experiment (docs/experiment.md): the small GPT trained for real over 2dc-1000km, 0-2000 km,
# repetitions, budget and rate sweeps, PyTorch's own schedules beside ours (about 8 minutes on 2 cores).
demo-real: install
	$(TESTBED) experiment $(DEMO_ARGS)

# The paper's regime with compute as time (docs/compute.md): a 7B-class GPT on one H100 per stage
# (profiles/gpt-7b-h100.yaml), 8 stages over two DCs, 0-3000 km, the headline budget and a budget sweep at 3000 km; the
# network, schedules and memory budget are real, the compute is the profile's. About 6 minutes on 2 cores.
demo-profile: install
	$(TESTBED) experiment 2dc-8stages --stages 8 --compute $(or $(PROFILE),gpt-7b-h100) \
		--distances 0,500,1000,2000,3000 --focus 3000 --repetitions 2 --microbatches 32 \
		--schedule 1f1b,1f1b-prefetch,geopipe --memory-budgets 1f1b+0,1f1b+2,1f1b+4 --rates "" --memory-budget 1f1b+1 \
		$(DEMO_ARGS)

# GeoPipe's own experiment in its regime (docs/paper.md): Llama 2 13B on 8 nodes of 8 Ascend 910B (TP 8 inside a
# node) over three regions, 256Ki tokens per step, each schedule at the shape the planner chose for it, the spine rate
# and distance swept, in slow motion (k = 4); the model beside every point. About 24 minutes on 2 cores.
demo-paper: install
	$(TESTBED) paper 3dc-8stages --compute $(or $(PROFILE),llama2-13b-910b-tp8) --spines 400,25 --distances 1000,3000 \
		$(DEMO_ARGS)

# The paper's congestion test (docs/congestion.md): a 1000 km PFC DC-OTN shared with background flows at 90 % of
# its rate, the spine port cut to half at iteration 3, once each with PFC, tail drop and a deep queue; one report
# with the plot. About 3 minutes on 2 cores.
congestion: install
	$(TESTBED) congestion $(DEMO_ARGS)

plan: install
	$(TESTBED) plan $(TOPO)

up: install
	$(TESTBED) up $(TOPO) --backend $(BACKEND) $(if $(NAME),--name $(NAME))

down: install
	$(TESTBED) down $(NAME)

status: install
	$(TESTBED) status $(NAME)

# Mininet's CLI on the running testbed (either backend).
cli: install
	$(TESTBED) cli $(NAME)

doctor: install
	$(TESTBED) doctor

bench-up: install
	$(PY) bench/bringup.py 4dc-32hosts --reps 3

bench-pipeline: install
	$(PY) bench/pipeline.py

# netns vs Mininet side by side: bring-up times and bubble ratios of the demo's workload.
bench-backends: install
	$(PY) bench/backends.py --reps 3

# verify --full 20 times on correct links (2dc-1000km, 4dc-ring) and 20 times on a link shaped 5 % slow.
bench-verify: install
	$(PY) bench/verify_repeat.py

# 30 minutes of continuous training across 4dc-ring on the delay line: drops, delay, daemon memory and CPU.
bench-soak: install
	$(PY) bench/soak.py $(if $(MINUTES),--minutes $(MINUTES))

# RDMA vs TCP over the same shaped link, side by side (needs rxe in namespaces: runs under the 7.x stock kernel).
bench-transport: install
	$(TESTBED) vm --out results/vm -- $(PY) bench/transport.py

# 1F1B and GeoPipe over TCP and RDMA, alternating on one link (time-scaled to TCG's compute; ~55 min: four runs of ~12 min).
bench-schedules-transport: install
	$(TESTBED) vm --timeout 7200 --out results/vm -- $(PY) bench/schedules_transport.py

# Where a step's time goes at 0 km and 1000 km: the ideal pipeline and the testbed's own cost, part by part, ranked.
breakdown: install
	$(PY) bench/breakdown.py $(ARGS)

# The 0 km bubble against the stated yardstick, in CPU time and against the old one, from the same launches.
bench-yardstick: install
	$(PY) bench/yardstick.py $(ARGS)

# The focus point (1000 km, 1f1b-prefetch and geopipe interleaved) RUNS times: spread of step times, speed-up, plans.
bench-repro: install
	$(PY) bench/repro.py --runs $(or $(RUNS),$(if $(filter-out real,$(or $(COMPUTE),real)),5,3)) --compute $(or $(COMPUTE),real) $(ARGS)

# Replay validated against real: real minus replay at 0 and 1000 km, and what the real run's breakdown accounts for.
bench-replay: install
	$(PY) bench/replay_vs_real.py $(ARGS)

# One part of the apparatus, variant against variant, interleaved (COMPARE=daemon|tcp|mtu|comm|affinity|sender|dilation).
bench-overhead: install
	$(PY) bench/overhead.py --compare $(or $(COMPARE),daemon) $(ARGS)

bench-links: install
	$(PY) bench/links.py $(if $(shell $(TESTBED) vm --check >/dev/null 2>&1 && echo y),--netem-vm)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
