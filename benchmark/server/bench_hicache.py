"""HiCache (L2 host pool, L3 `file` store) with weight identities, on real SGLang CPU servers.

    python benchmark/server/bench_hicache.py [--prompts 8] [--publications 4] [--flood 6] [--smoke]

Three tables:
1. **Publication with L2 populated** (vradix, nonce identity): before each publication the server serves the prompts
   (each 600 tokens; device, host by write-through, and L3) and `--flood` prompts of 700 tokens that push most of
   them out of the 4096-token device pool into the 8192-token host pool. Then one in_place publication
   (`/pause_generation` in_place, `/update_weights_from_disk`, `/continue_generation`), alternating B and A. Per
   publication: device tokens cached and host tokens used before it; device and host tokens freed by it (from
   `last_publication` in server info; "n/a" where this build does not report host figures); vradix's bump time and
   the client's update call time.
2. **L3 reuse after a restart on the same weights**: a writer serves the prompts on A and stops; a restarted server
   on A with the same identity mode serves them again. Storage hit rate = storage-hit tokens / prompt tokens. A
   nonce identity is new at every start, so it never reuses; a declared identity (`--weight-version run1-step5`)
   and a fingerprint identity do. (No latency column: for a tiny
   model on CPU, reading a page file costs about as much as recomputing its token, so latency would say nothing about
   a real model.)
3. **Stale L3 hits after a restart on new weights** (sglang #26792): a writer on A, then a server on B on the same
   store and served name. The B server never served the prompts, so every storage hit is A's KV; its outputs are
   compared with a fresh stock server on B without HiCache.

Measured on servers rather than at cache level: a publication with L2 populated then includes everything the engine
does at that point (the overlap drain, HiCache's write-through queue and controller threads, the L3 backend
attached), and the restart tables need real processes sharing a store. The fingerprint's own cost (hashing every
weight at startup and at each publication) is measured by `benchmark/kernels/bench_fingerprint.py`.

Servers start in two concurrent waves (start-up dominates on CPU): the writers and the fresh B server, then the
readers; the publication table runs last, alone, on the vradix reader of B.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
import tempfile
import time

import torch

from vradix.testing.harness.hicache_store import hicache_server, tiers, wait_stored
from vradix.testing.harness.server import CpuServer
from vradix.testing.models.llama import generate

NEW = 4
#: identity modes of the restart table: server keyword arguments (see `hicache_server`)
IDENTITIES = {"nonce (default)": {}, "declared run1-step5": dict(identity="declared", weight_version="run1-step5"),
              "fingerprint": dict(identity="fingerprint")}


def prompt_set(count: int, length: int, seed: int = 0) -> list:
    return [[(i * 11 + (seed + j) * 97) % 480 + 17 for i in range(length)] for j in range(count)]


def serve(server, prompts) -> list:
    return [server.generate(p, NEW, timeout=300) for p in prompts]


def write(model, store, prompts, **kw):
    """A writer: start, serve `prompts`, wait until their pages are stored, stop. Returns (responses, vradix info)."""
    with hicache_server(model, store, **kw) as s:
        responses = serve(s, prompts)
        for p in prompts:
            wait_stored(s, store, p)
        return responses, s.vradix_info()


def fresh_outputs(model, prompts) -> list:
    """Greedy outputs of a fresh stock server without HiCache."""
    with CpuServer(model, vradix=False, startup_timeout=600) as s:
        return [r["output_ids"] for r in serve(s, prompts)]


def start_reader(model, store, prompts, **kw):
    """A reader: start on the store, serve `prompts`. Returns (server, responses, vradix info); the caller stops it."""
    s = hicache_server(model, store, **kw)
    try:
        return s, serve(s, prompts), s.vradix_info()
    except BaseException:
        s.stop()
        raise


def in_parallel(jobs: dict) -> dict:
    """Run {name: (fn, args, kwargs)} concurrently; returns {name: result}. Raises the first error after every job
    ended (stopping the readers that started)."""
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        futs = {k: pool.submit(fn, *args, **kw) for k, (fn, args, kw) in jobs.items()}
        done, error = {}, None
        for k, f in futs.items():
            try:
                done[k] = f.result()
            except Exception as e:
                error = error or e
    if error is not None:
        for v in done.values():
            if isinstance(v, tuple) and isinstance(v[0], CpuServer):
                v[0].stop()
        raise error
    return done


def table(header, rows) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |", flush=True)


def publication_rows(s, models, prompts, flood, publications) -> list:
    """Table 1 on a vradix server with L2 and L3: populate, publish in place, read what the publication did."""
    rows, weights = [], "B"
    for n in range(1, publications + 1):
        serve(s, prompts)
        for p in flood:
            s.generate(p, 1, timeout=300)
        before = s.vradix_info()["pool"]
        weights = "A" if weights == "B" else "B"
        s.pause("in_place")
        t = time.perf_counter()
        s.update_weights(models[weights], f"pub{n}", timeout=300)
        call_ms = (time.perf_counter() - t) * 1e3
        s.resume()
        pub = s.vradix_info()["last_publication"]
        after = s.generate(prompts[0], NEW, timeout=300)["meta_info"]["cached_tokens"]
        host = before.get("host")
        rows.append([n, before["evictable"] + before["protected"], host["used"] if host else "n/a",
                     pub["tokens_freed"], pub.get("host_tokens_freed", "n/a"), pub["latency_ms"], round(call_ms, 1),
                     after])
    return rows


def reuse_rows(writers, readers, prompts) -> list:
    """Table 2: storage hits of a restart on the same weights, per identity mode."""
    prompt_tokens = sum(len(p) for p in prompts)
    rows = []
    for name in IDENTITIES:
        _, before = writers[name]
        _, read, after = readers[name]
        hit = sum(tiers(r)["storage"] for r in read)
        rows.append([name, before["weight_id"] == after["weight_id"], len(prompts), prompt_tokens, hit,
                     f"{hit / prompt_tokens:.1%}"])
    return rows


def stale_rows(readers, fresh_b) -> list:
    """Table 3: a B server reading a store A wrote, stock vs vradix."""
    rows = []
    for name, key in (("stock", "stock on B"), ("vradix (nonce)", "vradix on B")):
        _, read, _ = readers[key]
        stale = [r for r in read if tiers(r)["storage"] > 0]
        wrong = sum(r["output_ids"] != f for r, f in zip(read, fresh_b))
        rows.append([name, len(read), len(stale), sum(tiers(r)["storage"] for r in stale), wrong])
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=8, help="600-token prompts per server")
    p.add_argument("--publications", type=int, default=4)
    p.add_argument("--flood", type=int, default=6, help="700-token prompts that push the prompts out to host")
    p.add_argument("--smoke", action="store_true", help="2 prompts, 1 publication, 2 flood prompts")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    if a.smoke:
        a.prompts, a.publications, a.flood = 2, 1, 2
    workdir = a.workdir or tempfile.mkdtemp(prefix="vradix-bench-hicache-")
    models = {w: generate(os.path.join(workdir, w), seed=seed, dtype="float32", init_range=0.2)
              for w, seed in (("A", 1), ("B", 2))}
    store = os.path.join(workdir, "l3")
    os.makedirs(store, exist_ok=True)
    prompts, flood = prompt_set(a.prompts, 600), prompt_set(a.flood, 700, seed=1000)

    t0 = time.monotonic()
    wave1 = in_parallel({"fresh B": (fresh_outputs, (models["B"], prompts), {}),
                         "stock": (write, (models["A"], store, prompts), dict(vradix=False)),
                         **{k: (write, (models["A"], store, prompts), kw) for k, kw in IDENTITIES.items()}})
    readers = in_parallel({"stock on B": (start_reader, (models["B"], store, prompts), dict(vradix=False)),
                           "vradix on B": (start_reader, (models["B"], store, prompts), {}),
                           **{k: (start_reader, (models["A"], store, prompts), kw) for k, kw in IDENTITIES.items()}})
    publisher = readers["vradix on B"][0]
    try:
        with cf.ThreadPoolExecutor(len(readers)) as pool:
            list(pool.map(lambda r: r[0].stop(), [r for k, r in readers.items() if k != "vradix on B"]))
        pub_rows = publication_rows(publisher, models, prompts, flood, a.publications)
    finally:
        for server, _, _ in readers.values():
            server.stop()

    print(f"# HiCache with weight identities (CPU: {os.cpu_count()} cores, torch {torch.__version__}; "
          f"{a.prompts} prompts x 600 tokens, device pool 4096 tokens, host pool 8192, L3 file store; "
          f"{time.monotonic() - t0:.0f} s)")
    print(f"\n# 1. in_place publication with L2 populated ({a.flood} flood prompts x 700 tokens before each)")
    table(["publication", "device tokens cached", "host tokens used", "device tokens freed", "host tokens freed",
           "vradix bump ms", "update call ms", "cached tokens of a prompt after"], pub_rows)
    print("\n# 2. L3 reuse after a restart on the same weights (A)")
    table(["identity", "same weight_id", "prompts", "prompt tokens", "storage-hit tokens", "storage hit rate"],
          reuse_rows(wave1, readers, prompts))
    print("\n# 3. stale L3 hits after a restart on new weights (A wrote, B reads; same store, served name, label)")
    table(["server on B", "responses", "responses with a storage hit (stale)", "stale tokens loaded",
           "outputs != fresh B"], stale_rows(readers, wave1["fresh B"]))


if __name__ == "__main__":
    sys.exit(main())
