"""Helpers shared by the fault-injection E2E tests and the publication soak (real server, real HTTP calls).

- `strict_idle_check`: SGLang's idle memory invariant, read from the scheduler through `/get_server_info`
  (`vradix.pool`, one snapshot taken on the scheduler thread): once the engine is fully idle,
  `available + evictable + protected == total`, nothing is protected, every request slot is free, and no stale KV is
  pinned by a crossing request; on every TP rank of a multi-rank engine.
- `oracle_outputs`: greedy outputs of a *fresh* server on given weights (the no-stale-hit oracle).
- `publish`: one `update_weights_from_disk` publication that must succeed.
"""
from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Dict, Sequence

from vradix.testing.harness.server import CpuServer, fresh_stock_outputs, stock_server

#: env for servers under fault injection: SGLang's own busy-time accounting and KV page checks assert every step
STRICT_CHECK_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1", "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1"}


class LeakError(AssertionError):
    pass


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns a truthy value or `timeout` seconds pass (then TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def strict_idle_check(server: CpuServer, timeout: float = 60.0) -> dict:
    """Wait until the engine is fully idle (not paused), then assert the exact idle memory invariant, on every rank
    of a multi-rank engine (each data-parallel rank's block, each TP rank within it: `tp_ranks`). Returns the vradix
    block (rank 0's)."""
    def idle_blocks():
        states = server.server_info().get("internal_states") or [{}]
        blocks = [(state or {}).get("vradix") for state in states]
        ranks = [rank for v in blocks for rank in (v.get("tp_ranks") or [v])]
        return blocks if all(r["pool"]["idle"] and not r["pool"]["paused"] for r in ranks) else None

    blocks = wait_until(idle_blocks, timeout, "the engine to become idle")
    ranks = [rank for v in blocks for rank in (v.get("tp_ranks") or [v])]
    problems = [f"rank {rank}: {what}" for rank, block in enumerate(ranks) for what in idle_problems(block)]
    if problems:
        raise LeakError(f"{'; '.join(problems)}: {blocks}")
    return blocks[0]


def idle_problems(v: dict) -> list:
    """What breaks the idle invariant in one rank's vradix block (empty when it holds)."""
    p = v["pool"]
    problems = []
    if p["available"] + p["evictable"] + p["protected"] != p["total"]:
        problems.append("available + evictable + protected != total")
    if p["protected"]:
        problems.append("tokens still protected (locked) while idle")
    if p["req_slots_free"] != p["req_slots_total"]:
        problems.append("request slots not all free")
    if v["crossing_requests"] or v["stale_tokens_pinned"]:
        problems.append("stale KV still pinned while idle")
    return problems


def oracle_outputs(model_path: str, prompts: Dict[str, Sequence[Sequence[int]]], max_new_tokens: int = 4,
                   pool=None, **server_kw) -> Dict[str, list]:
    """The greedy output ids of every prompt, per group, as a fresh stock server on `model_path` answers them (one
    from `pool` when given: `stock_server`)."""
    with stock_server(model_path, pool, **server_kw) as s:
        return {name: [s.generate(p, max_new_tokens, timeout=300)["output_ids"] for p in group]
                for name, group in prompts.items()}


def oracle_output_sets(model_path: str, prompts: Sequence[Sequence[int]], max_new_tokens: int = 4,
                       batch: int = 4) -> list:
    """For each prompt, the set of greedy outputs a fresh stock server on `model_path` gives it alone and batched
    with others (`batch` concurrent requests).

    A tiny random model has a few greedy near-ties whose argmax flips with batch composition (float32 batched
    matmuls are not bit-identical across shapes); both outputs are what these weights produce, so a load test must
    accept either. Outputs of other weights differ in almost every token, so this does not hide a stale hit."""
    with CpuServer(model_path, vradix=False) as s:
        solo = [s.generate(p, max_new_tokens, timeout=300)["output_ids"] for p in prompts]
        with cf.ThreadPoolExecutor(batch) as pool:
            batched = list(pool.map(lambda p: s.generate(p, max_new_tokens, timeout=300)["output_ids"], prompts))
    return [{tuple(a), tuple(b)} for a, b in zip(solo, batched)]


def oracles(models: Dict[str, str], prompts: Dict[str, Sequence[Sequence[int]]], max_new_tokens: int = 4,
            pool=None) -> dict:
    """`oracle_outputs` for every named model: one stock server from `pool` answers them all in turn when given
    (`fresh_stock_outputs`), else fresh servers start concurrently."""
    if pool is not None:
        return fresh_stock_outputs(models, lambda s: {name: [s.generate(p, max_new_tokens, timeout=300)["output_ids"]
                                                             for p in group] for name, group in prompts.items()},
                                   pool=pool)
    with cf.ThreadPoolExecutor(len(models)) as pool:
        futs = {name: pool.submit(oracle_outputs, path, prompts, max_new_tokens) for name, path in models.items()}
        return {name: f.result() for name, f in futs.items()}


def publish(server: CpuServer, model_path: str, version: str, timeout: float = 120.0) -> dict:
    """One publication through `update_weights_from_disk` (no flush: vradix invalidates). Must succeed."""
    return server.update_weights(model_path, version, timeout=timeout)
