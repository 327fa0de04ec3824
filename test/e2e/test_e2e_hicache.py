"""E2E: HiCache L2/L3 across restarts, concurrent engines and publications, on real SGLang CPU servers.

Every HiCache server of this module shares one L3 store (SGLang's `file` backend in a tmpdir) and one served model
name, `--served-model-name tiny`; the weights are the tiny float32 models A and B (peaky logits). The store also
outlives every server, which is what a restart sees. The prompts are 600 tokens (a storage hit is 599 tokens: the
last token is always computed), greedy.

The oracle is a stock server without HiCache started on B; it then loads A and flushes (stock SGLang's idle flush
resets the cache), and every oracle answer is asserted to be computed from scratch (`cached_tokens == 0`).

Start-up dominates on CPU, so servers start in two waves (`STARTS_AT_ONCE` at a time) and are shared:
- wave 1, the writers (stock, vradix with a nonce identity, and with the declared identity `run1-step5`, all on A),
  and the oracle: each writer serves PROMPT, waits until its pages are in the store, and stops, but the declared
  writer, which keeps running as the declared reader's peer;
- wave 2, the readers, on the same store: stock on B, vradix (nonce) on B, and vradix declared `run1-step5` on A.
  Each serves PROMPT first (the restart tests), then the concurrent-engine tests use them and the declared peer;
- last, three publications run at once, one per reader (the in_place publication with L2 and L3 populated, and the
  stale-prefix scenario on stock and on vradix), and their tests check the outcomes.
A fingerprint writer and reader (`make test-long`) start after the readers.
"""
import concurrent.futures as cf

import pytest

from vradix.testing.harness.hicache_store import hicache_server, stored_pages, tiers, wait_stored
from vradix.testing.harness.reliability import strict_idle_check
from vradix.testing.harness.scenario import PROBE, stale_prefix_publication
from vradix.testing.harness.server import fresh_stock_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def prompt(seed: int, n: int = 600) -> list:
    return [(i * 11 + seed * 97) % 480 + 17 for i in range(n)]


PROMPT = prompt(0)
#: prompts each written by one engine and read by another while both run (test 4)
P_DECLARED, P_NONCE, P_SHARED = prompt(1), prompt(2), prompt(3)
#: 6 x 700 new tokens: more than the 4096-token device pool holds beside PROMPT; the 8192-token host pool keeps them,
#: PROMPT and the test-4 prompts
FLOOD = [prompt(10 + k, 700) for k in range(6)]
NEW = 6
STEP5, STEP6 = "run1-step5", "run1-step6"
#: servers of one wave that start at once: more only share the same two cores, and each start's deadline runs meanwhile
STARTS_AT_ONCE = 3
ORACLE_PROMPTS = {"prompt": PROMPT, "declared": P_DECLARED, "nonce": P_NONCE, "shared": P_SHARED, "probe": PROBE}


def fresh_outputs(s):
    out = {}
    for name, p in ORACLE_PROMPTS.items():
        r = s.generate(p, 4 if name == "probe" else NEW, timeout=300)
        assert r["meta_info"]["cached_tokens"] == 0, (r["meta_info"]["weight_version"], name)  # from scratch
        out[name] = r["output_ids"]
    return out


def oracle_outputs(models, pool):
    """Greedy outputs of a fresh stock server (no HiCache; `pool`'s) on B, then of the same process on A after an idle
    flush."""
    return fresh_stock_outputs({"B": models[1], "A": models[0]}, fresh_outputs, pool=pool, startup_timeout=600)


def write_prompt(model, store, **kw):
    """Start a HiCache server, serve PROMPT, wait until its pages are stored, stop. Returns (response, vradix info)."""
    r, info, s = write_prompt_and_keep(model, store, **kw)
    s.stop()
    return r, info


def write_prompt_and_keep(model, store, **kw):
    """`write_prompt`, the server left running. Returns (response, vradix info, server)."""
    s = hicache_server(model, store, **kw)
    try:
        r = s.generate(PROMPT, NEW, timeout=300)
        wait_stored(s, store, PROMPT)
        return r, s.vradix_info(), s
    except BaseException:
        s.stop()
        raise


class Reader:
    """A HiCache server started on a store others wrote, and its answer to the first request it served (PROMPT)."""

    def __init__(self, model, store, **kw):
        self.s = hicache_server(model, store, **kw)
        try:
            self.first = self.s.generate(PROMPT, NEW, timeout=300)
            self.info = self.s.vradix_info()
        except BaseException:
            self.s.stop()
            raise
            raise


def results(futures: dict) -> tuple:
    """({name: result} of the futures that succeeded, the first exception or None); waits for every future."""
    done, error = {}, None
    for name, f in futures.items():
        try:
            done[name] = f.result()
        except Exception as e:
            error = error or e
    return done, error


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return str(tmp_path_factory.mktemp("l3"))


FINGERPRINT_ENV = {"VRADIX_WEIGHT_IDENTITY": "fingerprint"}  # the env form of --vradix-weight-identity


@pytest.fixture(scope="module")
def wave1(models, store, server_pool):
    """The oracle and the writers, concurrently; the declared writer keeps running (`declared_peer`) until the end
    of the module."""
    declared = dict(identity="declared", weight_version=STEP5)
    with cf.ThreadPoolExecutor(STARTS_AT_ONCE) as pool:
        futs = {"oracle": pool.submit(oracle_outputs, models, server_pool),
                "stock": pool.submit(write_prompt, models[0], store, vradix=False),
                "nonce": pool.submit(write_prompt, models[0], store),
                "declared": pool.submit(write_prompt_and_keep, models[0], store, **declared)}
        done, error = results(futs)
    kept = done.pop("declared", None)
    try:
        if error is not None:
            raise error
        r, info, peer = kept
        yield {**done, "declared": (r, info), "declared_peer": peer}
    finally:
        if kept is not None:
            kept[2].stop()
            assert "Traceback" not in kept[2].logs(), kept[2].tail(80)


@pytest.fixture(scope="module")
def oracle(wave1):
    return wave1["oracle"]


@pytest.fixture(scope="module")
def readers(models, store, wave1):
    """The readers, started concurrently once the writers are done (all stopped but the declared one, the peer);
    stopped at the end of the module."""
    declared = dict(identity="declared", weight_version=STEP5)
    specs = {"stock": (models[1], dict(vradix=False)), "nonce": (models[1], {}), "declared": (models[0], declared)}
    with cf.ThreadPoolExecutor(STARTS_AT_ONCE) as pool:
        started, error = results({k: pool.submit(Reader, m, store, **kw) for k, (m, kw) in specs.items()})
    try:
        if error is not None:
            raise error
        yield started
    finally:
        with cf.ThreadPoolExecutor(len(specs)) as pool:
            list(pool.map(lambda r: r.s.stop(), started.values()))
    for r in started.values():
        assert "Traceback" not in r.s.logs(), r.s.tail(80)


# ---- 1. sglang #26792 across a restart: stock reads the old weights' pages, vradix (nonce) does not ------------------
def test_stock_restart_on_new_weights_serves_the_old_weights_kv_from_storage(wave1, readers, oracle):
    """The bug: same store, same served name, same label, different weights. Stock's B server loads A's pages."""
    written, _ = wave1["stock"]
    assert written["meta_info"]["cached_tokens"] == 0 and written["output_ids"] == oracle["A"]["prompt"]
    r = readers["stock"].first
    assert r["meta_info"]["weight_version"] == written["meta_info"]["weight_version"] == "default"
    assert tiers(r)["storage"] == len(PROMPT) - 1, r["meta_info"]  # A's KV, loaded from L3 into a B server
    assert r["output_ids"] != oracle["B"]["prompt"]  # and a wrong answer


def test_vradix_restart_on_new_weights_never_reads_the_old_weights_pages(wave1, readers, oracle, store):
    written, before = wave1["nonce"]
    reader = readers["nonce"]
    r, after = reader.first, reader.info
    assert before["weight_identity"] == after["weight_identity"] == {"mode": "nonce", "source": "nonce"}
    assert before["epoch"] == after["epoch"] == 0 and before["label"] == after["label"] == "default"
    assert before["weight_id"] != after["weight_id"]
    assert stored_pages(store, PROMPT, None) == len(PROMPT)  # stock's pages of A are there too, unnamespaced
    assert r["meta_info"]["cached_tokens"] == 0 and tiers(r)["storage"] == 0, r["meta_info"]
    assert r["output_ids"] == oracle["B"]["prompt"]
    assert written["output_ids"] == oracle["A"]["prompt"]


# ---- 2. the same weights across a restart: a declared (or proven) identity reuses the pages --------------------------
def test_declared_identity_reuses_storage_across_a_restart(wave1, readers, oracle):
    written, before = wave1["declared"]
    r, after = readers["declared"].first, readers["declared"].info
    assert before["weight_id"] == after["weight_id"] == f"declared:{STEP5}"
    assert after["weight_identity"] == {"mode": "declared", "source": "declared"} and after["epoch"] == 0
    assert written["meta_info"]["cached_tokens"] == 0
    assert tiers(r)["storage"] == len(PROMPT) - 1, r["meta_info"]
    assert r["output_ids"] == oracle["A"]["prompt"]
    assert after["kv_ledger"]["violations_caught"] == 0  # the strict guard accepted the pages loaded from L3


@pytest.fixture(scope="module")
def fingerprint_restart(models, store, readers):
    """A fingerprint writer on A, then, once it stopped, a fingerprint reader on A, on the same store (after the
    readers, which it does not disturb). Yields (the writer's vradix info, the reader)."""
    _, before = write_prompt(models[0], store, env=FINGERPRINT_ENV)
    reader = Reader(models[0], store, env=FINGERPRINT_ENV)
    try:
        yield before, reader
    finally:
        reader.s.stop()


@pytest.mark.long  # two more HiCache starts: storage keys are built from the weight_id alone, so the declared restart
# above covers the reuse, and test_e2e_identity.py / test_e2e_tp.py prove fingerprints equal across processes
def test_fingerprint_identity_reuses_storage_across_a_restart(fingerprint_restart, oracle):
    before, reader = fingerprint_restart
    r, after = reader.first, reader.info
    assert before["weight_id"] == after["weight_id"] and after["weight_id"].startswith("fp:")
    assert after["weight_identity"] == {"mode": "fingerprint", "source": "fingerprint"}
    assert tiers(r)["storage"] == len(PROMPT) - 1, r["meta_info"]
    assert r["output_ids"] == oracle["A"]["prompt"]


# ---- 4. two engines running at once on one store ---------------------------------------------------------------------
def test_concurrent_engines_on_different_weights_never_read_each_others_pages(readers, oracle, store):
    a, b = readers["declared"].s, readers["nonce"].s  # A (declared run1-step5) and B (nonce), both running
    a.generate(P_DECLARED, NEW)
    wait_stored(a, store, P_DECLARED)
    r = b.generate(P_DECLARED, NEW)
    assert r["meta_info"]["cached_tokens"] == 0 and r["output_ids"] == oracle["B"]["declared"], r["meta_info"]
    b.generate(P_NONCE, NEW)
    wait_stored(b, store, P_NONCE)
    r = a.generate(P_NONCE, NEW)
    assert r["meta_info"]["cached_tokens"] == 0 and r["output_ids"] == oracle["A"]["nonce"], r["meta_info"]


def test_concurrent_engines_with_an_equal_declared_identity_share_pages(wave1, readers, oracle, store):
    a, peer = readers["declared"].s, wave1["declared_peer"]  # both A, both declared run1-step5, both running
    a.generate(P_SHARED, NEW)
    wait_stored(a, store, P_SHARED)
    r = peer.generate(P_SHARED, NEW)
    assert tiers(r)["storage"] == len(P_SHARED) - 1, r["meta_info"]
    assert r["output_ids"] == oracle["A"]["shared"]


# ---- 3. and 5. publications on HiCache servers, the three at once ----------------------------------------------------
def in_place_publication_with_l2_and_l3(s, new_model):
    """On the declared reader (A, run1-step5; PROMPT came from L3): demote PROMPT to host, show that the host holds
    it (and what the KV page ledger saw), then publish `new_model` in place as run1-step6. Returns the answer loaded
    back from host, the ledger before and after it, the update response, the server info right after the
    publication, and the first answer to PROMPT after it."""
    for p in FLOOD:  # PROMPT leaves the device pool, its host copy stays
        s.generate(p, 1, timeout=300)
    ledger_before = s.vradix_info()["kv_ledger"]
    held = s.generate(PROMPT, NEW)
    assert tiers(held) == {"device": 0, "host": len(PROMPT) - 1, "storage": 0}, held["meta_info"]
    ledger_held = s.vradix_info()["kv_ledger"]
    view_held = s.get("/vradix/cache?limit=1").json()
    assert s.post("/pause_generation", {"mode": "in_place"}).status_code == 200
    upd = s.post("/update_weights_from_disk", {"model_path": new_model, "flush_cache": False,
                                               "weight_version": STEP6}, timeout=300).json()
    assert s.post("/continue_generation").status_code == 200
    info = s.vradix_info()
    view_after = s.get("/vradix/cache?limit=1").json()
    return {"held": held, "ledger_before": ledger_before, "ledger_held": ledger_held, "update": upd, "info": info,
            "view_held": view_held, "view_after": view_after, "probe": s.generate(PROMPT, NEW)}


@pytest.fixture(scope="module")
def published(models, readers):
    """Publish on three readers at once: B in place on the declared reader (test 3); A, by the stale-prefix scenario
    of test_e2e_server, on the stock and on the vradix (nonce) readers of B (test 5)."""
    with cf.ThreadPoolExecutor(3) as pool:
        futs = {"in_place": pool.submit(in_place_publication_with_l2_and_l3, readers["declared"].s, models[1]),
                "stock": pool.submit(stale_prefix_publication, readers["stock"].s, models[0]),
                "vradix": pool.submit(stale_prefix_publication, readers["nonce"].s, models[0])}
        return {k: f.result() for k, f in futs.items()}


def test_ledger_verifies_a_prefix_loaded_back_from_the_host_pool(published, readers, oracle):
    """The KV page ledger and its strict guard stay on with HiCache (L2 and L3): PROMPT, read from L3 at the restart
    and demoted to host by the flood, is loaded back, verified and reused with the fresh server's output."""
    s = readers["declared"].s
    assert "KV page ledger on" in s.logs() and "KV page ledger disabled" not in s.logs()
    p = published["in_place"]
    before, after = p["ledger_before"], p["ledger_held"]
    assert before["enabled"] and before["verify_mode"] == "strict"
    assert p["held"]["output_ids"] == oracle["A"]["prompt"]
    assert after["violations_caught"] == 0, after["last_violation"]
    assert after["prefixes_verified"] > before["prefixes_verified"]  # the loaded-back prefix itself was verified


def test_in_place_publication_misses_device_host_and_storage(published, readers, oracle):
    p = published["in_place"]
    upd, info, probe = p["update"], p["info"], p["probe"]
    assert upd["success"] and f"weight_id=declared:{STEP6}" in upd["message"], upd
    assert info["weight_id"] == f"declared:{STEP6}" and info["epoch"] == 1 and info["publications"] == 1
    assert info["last_publication"]["weight_id"] == f"declared:{STEP6}"
    assert info["last_publication"]["tokens_freed"] > 0  # PROMPT's (and the flood's) device KV of A
    assert probe["meta_info"]["cached_tokens"] == 0, probe["meta_info"]
    assert tiers(probe) == {"device": 0, "host": 0, "storage": 0}
    assert probe["output_ids"] == oracle["B"]["prompt"]
    assert probe["meta_info"]["weight_version"] == STEP6
    strict_idle_check(readers["declared"].s)


def test_in_place_publication_frees_the_stale_host_copies(published):
    """Every stale host copy is freed at the bump but those an L3 backup still in flight holds (the flood's last
    prompts, when their storage writes have not finished yet): the bump reports those as left, and they are all the
    host pool still holds."""
    info = published["in_place"]["info"]  # read right after the publication, the engine idle
    last = info["last_publication"]
    assert last["host_tokens_freed"] >= len(PROMPT) - 1, last
    host = info["pool"]["host"]
    assert host["used"] == last["host_tokens_left"] and host["available"] == host["total"] - host["used"], (host, last)


def test_cache_inspector_shows_the_host_and_storage_tiers_per_weights(published):
    """`GET /vradix/cache` on the declared reader: the host pool's tokens per epoch move from epoch 0 (PROMPT held in
    host) to none of epoch 0 after the publication; the L3 figures name the file backend and count this process's
    backed-up pages under the weight identity that wrote them."""
    held, after = published["in_place"]["view_held"], published["in_place"]["view_after"]
    assert held["host"]["tokens_by_epoch"].get("0", 0) >= len(PROMPT) - 1, held["host"]
    left = published["in_place"]["info"]["last_publication"]["host_tokens_left"]  # held by L3 backups in flight
    assert (after["host"]["tokens_by_epoch"] or {}).get("0", 0) == left, after["host"]
    assert "File" in held["storage"]["backend"], held["storage"]
    backed_up = held["storage"]["pages_backed_up_by_weight_id"]
    assert set(backed_up) == {f"declared:{STEP5}"} and backed_up[f"declared:{STEP5}"] > 0, backed_up


def test_stock_stale_prefix_scenario_on_hicache(published, oracle):
    o = published["stock"]  # the stock reader of B published A
    assert o.cached_after == len(PROBE) - 1 and o.label_after == "v2"
    assert o.output_after != oracle["A"]["probe"]  # B's KV under A's label


def test_vradix_stale_prefix_scenario_on_hicache(published, readers, oracle):
    o = published["vradix"]  # the vradix (nonce) reader of B published A
    assert o.cached_after == 0, o
    assert o.output_after == oracle["A"]["probe"]
    assert o.inflight_retractions == 0 and o.inflight_tokens == 300
    assert o.cached_again == len(PROBE) - 1  # prefix sharing resumes under the new epoch
    assert o.vradix["epoch"] == 1 and o.vradix["weight_id"] != readers["nonce"].info["weight_id"]
    assert o.vradix["crossing_requests"] == 0 and o.vradix["stale_tokens_pinned"] == 0
    strict_idle_check(readers["nonce"].s)
