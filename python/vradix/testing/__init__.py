"""Test aids, never imported by the product (only `make demo` uses them): `cpu_aids` (CPU-only patches to SGLang,
each refusing on a CUDA host), `models` (tiny model generators) and `harness` (servers, fixtures, scenarios)."""
