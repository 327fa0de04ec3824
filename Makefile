# vradix: the two commands a fresh CPU machine needs are `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast bench bench-rl clean

setup:  ## build .venv from nothing (idempotent; reruns are fast)
	bash scripts/setup_env.sh

demo: setup  ## CPU server on a tiny model: stale-prefix publication scenario, stock vs vradix
	$(PY) -m vradix.demo

test: setup  ## cache-level, plugin and end-to-end server tests (CPU)
	$(PY) -m pytest -q -p no:cacheprovider --timeout=1200 test $(PYTEST_ARGS)

test-fast: setup  ## everything except the E2E server tests
	$(PY) -m pytest -q -p no:cacheprovider -m "not e2e" test $(PYTEST_ARGS)

bench: setup  ## publication cost on the real UnifiedRadixCache (prints a table)
	$(PY) benchmark/bench_publication.py

bench-rl: setup  ## RL rollout benchmark, four publication modes on CPU servers (table + JSON + PNG, ~10 min)
	$(PY) benchmark/bench_rl_rollout.py

clean:
	rm -rf $(VENV) build python/*.egg-info
