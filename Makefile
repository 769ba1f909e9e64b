# knobfleet — make demo · make test · make lint · make perf
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)
APT_PACKAGES := systemd systemd-container openssh-server dbus iproute2 prometheus prometheus-node-exporter podman docker.io crun
# What `make test` needs on top: chromium, for the HTML report's test (every report kind opened headless, offline).
TEST_APT_PACKAGES := chromium

.PHONY: demo test unit integration lint perf system-deps test-deps venv vllm sglang router clean lab-down mutation mutation-quick \
	coverage monitoring-check

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*; touch $@

# Byte-compile the package: where PYTHONDONTWRITEBYTECODE is set, every command would otherwise recompile
# ~70 ms of source (compileall writes the .pyc files anyway; a stale one is simply recompiled in memory).
venv: $(STAMP)
	@$(BIN)/python -m compileall -q python/knobfleet >/dev/null

# Installs the lab's system packages when missing (idempotent; needs root). Packages that ship a service
# (prometheus, node_exporter, sshd) must not start it on this machine (it would listen on every address): a
# policy-rc.d that denies starts is put in place for the install when the machine has none.
define apt_install
missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" != 0 ]; then echo "make: need root to install:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
  echo "installing:$$missing"; \
  guard=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d && guard=1; fi; \
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; rc=$$?; \
  if [ -n "$$guard" ]; then rm -f /usr/sbin/policy-rc.d; fi; exit $$rc; \
fi
endef

system-deps:
	@$(call apt_install,$(APT_PACKAGES))

test-deps:
	@$(call apt_install,$(APT_PACKAGES) $(TEST_APT_PACKAGES))

demo: venv system-deps router
	$(BIN)/knobfleet profiles validate
	$(BIN)/knobfleet lab up -n 3
	$(BIN)/knobfleet lab status
	$(BIN)/apply-profile ctas512 --yes


# Real vLLM (CPU build) for the vLLM lab host: installed once into /var/cache/knobfleet, then a no-op. 0.31.0 too,
# side by side: the upgrade test rolls a host from one to the other (tests/integration/test_vllm.py).
vllm: venv
	$(BIN)/python -m knobfleet.lab.vllm_install
	$(BIN)/python -m knobfleet.lab.vllm_install --version 0.31.0

# Real SGLang 0.5.23 (CPU path, knobfleet's placeholder sgl_kernel, the tiny model) for `lab up --sglang HOSTS`:
# installed once into /var/cache/knobfleet (~3 min, 6.4 GB), then a no-op.
sglang: venv
	$(BIN)/python -m knobfleet.lab.sglang_install

# The lab's routers (sglang-router 0.3.2 and SMG 1.13, pinned) for `lab up --router [KIND]`: installed once into
# /var/cache/knobfleet, then a no-op.
router: venv
	$(BIN)/python -m knobfleet.lab.router_install

# The integration suite runs in parallel shards (tools/shards.py), each with a lab of its own (lab id shardK: its
# own addresses, machines and ports), so a demo lab or another checkout's lab may stay up meanwhile. Installs run
# once, above, before any shard. KNOBFLEET_SHARDS=N sets the number of shards (default: from cores and memory).
test: venv test-deps vllm sglang router
	$(BIN)/python -m pytest -q tests/unit
	$(MAKE) --no-print-directory monitoring-check
	$(BIN)/python tools/shards.py

integration: venv test-deps vllm sglang router
	$(BIN)/python tools/shards.py

unit: venv
	$(BIN)/python -m pytest -q tests/unit

# The shipped Prometheus rules (monitoring/): syntax, then their unit tests (alerts fire and resolve as written).
monitoring-check: system-deps
	promtool check rules monitoring/rules/*.yml
	cd monitoring/tests && promtool test rules *.test.yml

# Mutation testing of the pure core (tools/mutation.py, mutmut; [tool.mutmut] in pyproject.toml): every mutant
# runs the unit tests that call the mutated function, two at a time. Last line: "mutation score: N%".
# Surviving mutants that cannot be killed are listed with the reason in docs/TESTING.md.
mutation: venv
	$(BIN)/python tools/mutation.py

# The CI subset: the pure-core modules changed since the last release tag (v*), else a fixed sample.
mutation-quick: venv
	$(BIN)/python tools/mutation.py --quick

# Line coverage of the unit suite (tools/unit_coverage.py) for experiment/ab.py, experiment/gate.py,
# ops/transaction.py, ops/history.py and the on-host modules (roles/*/library, module_utils); the data stays in
# build/coverage/unit.coverage for `coverage combine` with other runs. Last line: "watched coverage: N%".
coverage: venv
	$(BIN)/python tools/unit_coverage.py

# The knobfleet.serving Ansible collection, generated from roles/, playbooks/ and python/knobfleet/module_utils
# (python/knobfleet/collection.py): dist/knobfleet-serving-<version>.tar.gz, and dist/knobfleet-serving.tar.gz
# for execution-environment.yml.
collection: venv
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m knobfleet.collection --out dist
	cp -f dist/knobfleet-serving-$$($(BIN)/python -c 'import knobfleet; print(knobfleet.__version__)').tar.gz dist/knobfleet-serving.tar.gz

# The execution environment's build context (no container runtime needed); `ansible-builder build` builds it.
ee-context: collection
	$(BIN)/ansible-builder create -f execution-environment.yml -c build/ee

lint: venv
	$(BIN)/ruff check python tests perf tools roles
	$(BIN)/ruff format --check python tests perf tools roles
	$(BIN)/mypy
	$(BIN)/yamllint -s profiles inventories playbooks roles
	cd $(CURDIR) && $(BIN)/ansible-lint -q --offline playbooks roles  # --offline: no schema refresh, no release check
	rm -rf build/lint-collection && $(BIN)/python -m knobfleet.collection --tree build/lint-collection/ansible_collections/knobfleet/serving >/dev/null
	cd build/lint-collection/ansible_collections/knobfleet/serving && ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/build/lint-collection $(CURDIR)/$(BIN)/ansible-lint -q --offline --profile production

perf: venv system-deps
	$(BIN)/python perf/decision_quality.py
	$(BIN)/python perf/lab_boot.py
	$(BIN)/python perf/drift_vs_ssh.py --sizes 3,8,16 --repeats 5
	$(BIN)/python perf/apply_overhead.py --hosts 3 --repeats 5
	$(BIN)/python perf/no_change_apply.py --sizes 3,16 --repeats 3
	$(BIN)/knobfleet lab down --all

lab-down: venv
	$(BIN)/knobfleet lab down --all

clean: lab-down
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache
