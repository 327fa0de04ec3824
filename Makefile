# vradix: the two commands a fresh CPU machine needs are `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup lint typecheck demo test test-long test-fast bench bench-kernels bench-rl bench-rl-train csrc wheel gpu-bundle clean

setup:  ## build .venv from nothing (idempotent; reruns are fast)
	bash scripts/setup_env.sh

demo: setup  ## CPU server on a tiny model: stale-prefix publication scenario, stock vs vradix
	$(PY) -m vradix.demo

lint: setup  ## ruff with a small rule set (pyproject.toml: pyflakes and syntax errors)
	$(VENV)/bin/ruff check python test benchmark scripts

typecheck: setup  ## mypy on python/vradix (pyproject.toml [tool.mypy]: lenient globally, strict for the listed modules)
	$(PY) -m mypy

test: setup lint typecheck  ## lint, then the cache-level, plugin and end-to-end server tests on two workers (CPU; what CI runs)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --timeout=1200 --durations=40 -m "not long" test $(PYTEST_ARGS)

test-long: setup  ## the long profiles CI leaves out (benchmark smokes that repeat E2E coverage)
	$(PY) -m pytest -q -p no:cacheprovider --timeout=1200 --durations=40 -m long test $(PYTEST_ARGS)

test-fast: setup  ## everything except the E2E server tests
	$(PY) -m pytest -q -p no:cacheprovider -m "not e2e" test $(PYTEST_ARGS)

bench: setup  ## publication cost on the real UnifiedRadixCache (prints a table)
	$(PY) benchmark/cache/bench_publication.py

bench-kernels: setup  ## KV page-epoch kernels (torch reference on CPU; all implementations on CUDA)
	$(PY) benchmark/kernels/bench_kernels.py

csrc: setup  ## compile csrc/ into vradix._C for sm_90 (build/csrc-sm90; compile check on CPU machines)
	PY=$(PY) bash scripts/build_csrc.sh

bench-rl: setup  ## RL rollout benchmark, every publication mode (exact, and bounded K = 1, 2) on CPU servers (tables + JSON + PNGs, ~15 min)
	@echo "[bench-rl] every publication mode on CPU servers: about 15 minutes on 2 cores (progress bar on a terminal)"
	$(PY) benchmark/rl_rollout

bench-rl-train: setup  ## RL training loop: GRPO on a self-pretrained tiny policy, every publication mode on CPU servers (tables, JSON and two PNGs; ~8 min on 2 cores)
	@echo "[bench-rl-train] every run, both workloads: about 8 minutes on 2 cores"
	$(PY) benchmark/rl_train

wheel: setup  ## dist/: the plugin wheel and the replacement sglang-0.5.23+vradix wheel (docs/packaging.md)
	$(PY) scripts/build_wheels.py

gpu-bundle: setup  ## build/gpu-bundle/vradix-gpu-bundle.tar.xz: SGLang, its serving deps and vradix for an offline CUDA machine with torch (≤ 60 MiB; docs/gpu-bundle.md)
	$(PY) scripts/gpu_bundle.py

clean:
	rm -rf $(VENV) build dist python/*.egg-info
