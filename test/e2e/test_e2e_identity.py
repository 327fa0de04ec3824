"""E2E: the weight identity on a real CPU server (no HiCache needed to see it): in `declared` mode the startup
`--weight-version` and each publication's label are the identity, a reused declaration is refused (HTTP 400) on
every publication path and changes nothing; in `fingerprint` mode equal weights get equal identities, across two
servers and across publications. The publish client's fleet view on the same servers: one publication gives two
fingerprint engines one `weight_id`; a publication that loads other weights on one of them fails with both left
paused; a fleet mixing declared and fingerprint engines is refused before anything is touched. A DP = 2 engine in
the default identity mode (no vradix flag: `nonce`): every rank reports one `weight_id` at startup and after
`vradix publish`, which verifies both, and the outputs equal a fresh server on the new weights (the TP = 2 engine's
ranks are checked the same way in `test_e2e_tp.py`, on its default-mode engine). The L3 consequences are in
`test_e2e_hicache.py`."""
import json
import subprocess
import sys

import pytest
import requests

from vradix.client import PublishError, publish
from vradix.testing.harness.scenario import PROBE, PREFIX
from vradix.testing.harness.server import fresh_stock_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def identity_of(s):
    v = s.vradix_info()
    return v["weight_id"], v["weight_identity"], v["epoch"], v["label"]


DECLARED_FLAGS = ["--vradix-weight-identity", "declared", "--weight-version", "run1-step0"]
FINGERPRINT_FLAGS = ["--vradix-weight-identity", "fingerprint"]


@pytest.fixture(scope="module")
def prestarted(models, server_pool):
    """The module's three servers start together: one declared `run1-step0`, two with fingerprint identities; each
    waits parked in the pool (taking no CPU) until its tests lease it."""
    server_pool.prestart((models[0], dict(extra_args=DECLARED_FLAGS)),
                         *[(models[0], dict(extra_args=FINGERPRINT_FLAGS))] * 2)


#: the default identity mode's engines of several ranks (no vradix flag): DP = 2 (each DP rank's OpenMP threads on
#: a core of its own); TP = 2 is `test_e2e_tp.py`'s default-mode engine
MULTI_RANK = {"dp2": dict(extra_args=["--dp-size", "2"], env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"})}


def rank_blocks(server) -> list:
    """Every scheduler rank's vradix block: each DP rank's, and each TP rank's within it."""
    info = server.get("/get_server_info").json()
    return [rank for state in info["internal_states"] for rank in (state["vradix"].get("tp_ranks")
                                                                   or [state["vradix"]])]


@pytest.fixture(scope="module")
def declared(models, server_pool, prestarted):
    with server_pool.lease(models[0], once=True, extra_args=DECLARED_FLAGS) as s:
        yield s


@pytest.fixture(scope="module")
def fingerprinted(models, server_pool, prestarted):
    with server_pool.lease_many(2, models[0], once=True, extra_args=FINGERPRINT_FLAGS) as pair:
        yield pair


def test_startup_and_publications_carry_the_declared_identity(declared, models):
    s = declared
    assert identity_of(s)[:2] == ("declared:run1-step0", {"mode": "declared", "source": "declared"})
    r = s.post("/update_weights_from_disk", {"model_path": models[1], "weight_version": "run1-step1"})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert "weight_id=declared:run1-step1" in r.json()["message"]
    assert identity_of(s)[0] == "declared:run1-step1"
    meta = s.generate(PROBE, 2)["meta_info"]
    assert meta["prefix_cache"]["weight_id"] == "declared:run1-step1"


def test_a_reused_declaration_is_refused_on_every_path_and_changes_nothing(declared, models):
    s = declared
    before = identity_of(s)
    used = "run1-step0"  # the startup identity
    r = s.post("/update_weights_from_disk", {"model_path": models[0], "weight_version": used})
    assert r.status_code == 400 and "already used by an earlier publication" in r.text
    assert identity_of(s) == before
    r = s.post("/update_weight_version", {"new_version": used})
    assert r.status_code == 400 and "already used by an earlier publication" in r.text
    assert identity_of(s) == before
    assert requests.get(s.url + "/model_info", timeout=30).json()["weight_version"] == before[3]  # launcher's too
    r = s.post("/update_weight_version", {"new_version": "run1-step2"})  # a new declaration is a publication
    assert r.status_code == 200 and identity_of(s)[0] == "declared:run1-step2"


def test_fingerprint_identities_are_equal_for_equal_weights_across_servers_and_publications(fingerprinted, models):
    """Two servers started on the same checkpoint prove the same identity; publishing other weights changes it;
    publishing the first weights again brings it back (the same bytes, the same proof)."""
    s1, s2 = fingerprinted
    (a1, how, _, _), (a2, _, _, _) = identity_of(s1), identity_of(s2)
    assert a1 == a2 and a1.startswith("fp:") and how == {"mode": "fingerprint", "source": "fingerprint"}
    assert s1.post("/update_weights_from_disk", {"model_path": models[1]}).json()["success"]
    b = identity_of(s1)[0]
    assert b.startswith("fp:") and b != a1
    assert s1.post("/update_weights_from_disk", {"model_path": models[0]}).json()["success"]
    assert identity_of(s1)[0] == a1


def publish_cli(*args):
    return subprocess.run([sys.executable, "-m", "vradix.publish", *args], capture_output=True, text=True,
                          timeout=300)


def assert_paused(server):
    """A generation does not complete: the engine is paused."""
    with pytest.raises(requests.Timeout):
        requests.post(server.url + "/generate", json={"input_ids": PROBE, "sampling_params": {"max_new_tokens": 1}},
                      timeout=5)


def test_the_publish_client_gives_a_fingerprint_fleet_one_weight_id_and_fails_one_that_disagrees(fingerprinted,
                                                                                                  models):
    """One publication of B: the fleet's one weight_id is B's fingerprint, served by both. A callable transfer that
    loads A on the first engine and B on the second is one publication whose engines disagree: PublishError naming
    both identities, neither engine reported verified, both left paused. The CLI then publishes A to both: exit 0,
    a line per engine, and the fleet line last."""
    s1, s2 = fingerprinted
    urls = [s1.url, s2.url]
    ok = publish(urls, models[1], "fleet-b")
    b = identity_of(s1)[0]
    assert (ok.fleet.weight_id, ok.fleet.mode) == (b, "fingerprint") and identity_of(s2)[0] == b
    assert [(e["url"], e["weight_id"], e["in_fleet"]) for e in ok.fleet.engines] == [(u, b, True) for u in urls]

    def split(engine, version):  # one publication, other weights on the first engine
        model = models[0] if engine.url == s1.url else models[1]
        engine.post_ok("/update_weights_from_disk", {"model_path": model, "weight_version": version,
                                                     "flush_cache": False})

    with pytest.raises(PublishError) as e:
        publish(urls, split, "fleet-split")
    a = identity_of(s1)[0]
    assert a != b and identity_of(s2)[0] == b
    message = str(e.value)
    assert "engines that must serve one weight identity (fingerprint mode" in message, message
    assert repr(a) in message and repr(b) in message and "engines left paused" in message
    assert [r.state for r in e.value.results] == ["paused(in_place)"] * 2, message
    assert not any(r.verified for r in e.value.results) and all(r.checks_passed for r in e.value.results)
    for s in (s1, s2):
        assert_paused(s)
        assert s.post("/continue_generation").status_code == 200

    cli = publish_cli("--url", s1.url, "--url", s2.url, "--model-path", models[0], "--version", "fleet-a")
    assert cli.returncode == 0, cli.stderr[-3000:]
    *engines, fleet = [json.loads(x) for x in cli.stdout.splitlines()]
    assert [(x["url"], x["verified"], x["weight_ids_after"]) for x in engines] == [(u, True, [a]) for u in urls]
    assert (fleet["fleet"]["weight_id"], fleet["fleet"]["mode"]) == (a, "fingerprint") and identity_of(s2)[0] == a
    assert [(x["url"], x["in_fleet"]) for x in fleet["fleet"]["engines"]] == [(u, True) for u in urls]


def test_a_fleet_mixing_declared_and_fingerprint_engines_is_refused_before_anything_is_touched(declared,
                                                                                               fingerprinted, models):
    """A declaration and a fingerprint are never the same weight_id: the CLI exits 2 naming both modes, and both
    engines are left as they were, serving (no pause, no update)."""
    s, f = declared, fingerprinted[0]
    before = [identity_of(x) for x in (s, f)]
    cli = publish_cli("--url", s.url, "--url", f.url, "--model-path", models[1], "--version", "run1-step9")
    assert cli.returncode == 2, cli.stdout + cli.stderr[-3000:]
    assert "the fleet mixes identity modes" in cli.stderr and "'declared'" in cli.stderr, cli.stderr
    assert "'fingerprint'" in cli.stderr and cli.stderr.count("left running") == 2, cli.stderr
    assert [identity_of(x) for x in (s, f)] == before
    for x in (s, f):
        assert x.generate(PROBE, 1)["meta_info"]["completion_tokens"] == 1


@pytest.mark.parametrize("name", list(MULTI_RANK))
def test_every_rank_of_a_default_mode_dp2_engine_reports_one_weight_id_and_publish_verifies_them(
        name, models, server_pool):
    """Nonce identities (the default mode off P/D) are derived from the engine's launch, so the two ranks of a DP = 2
    engine report one `weight_id`, at startup and after `vradix publish` (which fails a publication
    whose ranks disagree). A prefix cached under A is not reused under B: outputs equal a fresh stock server on B.
    One multi-rank engine runs at a time (each holds two scheduler processes)."""
    prompts = [PROBE, PREFIX + [7, 8, 9]]
    oracle = fresh_stock_outputs({"B": models[1]}, lambda s: [s.generate(p, 4)["output_ids"] for p in prompts],
                                 pool=server_pool)["B"]
    with server_pool.lease(models[0], once=True, **MULTI_RANK[name]) as s:
        blocks = rank_blocks(s)
        assert len(blocks) == 2, blocks
        ids = {b["weight_id"] for b in blocks}
        assert len(ids) == 1 and ids.pop().startswith("nonce:"), blocks
        before = blocks[0]["weight_id"]
        for p in prompts:  # caches the prefixes under A (on every DP rank the router picks)
            s.generate(p, 4)
        result = publish([s.url], models[1], "multi-rank-b")
        assert [e.verified for e in result] == [True], [e.evidence() for e in result]
        blocks = rank_blocks(s)
        ids = {b["weight_id"] for b in blocks}
        assert len(ids) == 1 and before not in ids and {b["epoch"] for b in blocks} == {1}, blocks
        for _ in range(2):  # both DP ranks serve (round robin)
            assert [s.generate(p, 4)["output_ids"] for p in prompts] == oracle
