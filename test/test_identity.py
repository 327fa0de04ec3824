"""Weight identity (`vradix.identity`): every epoch carries a global `weight_id`, its namespace is built from it, and
so are HiCache storage keys (SGLang's own `get_storage_hash_str` over a stamped key, as HiCache computes them).

Restarts and separate engines are separate `attach` calls on separate real caches: a restarted engine starts at epoch
0 again, so an epoch number alone cannot tell two engines' KV apart; the weight identity does."""
import os
import types

import pytest

from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.server_args import prepare_server_args

from vradix import identity, settings
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache

TOKENS = list(range(100, 164))


def engine(weight_identity=None, mode="nonce"):
    """A freshly started engine (epoch 0) with the given startup identity."""
    fx = build_cache("rust", 1, kv_tokens=256, max_reqs=4)
    return fx, attach(fx.cache, weight_identity=weight_identity, identity_mode=mode)


def storage_keys(fx, state, tokens=TOKENS, user_key=None):
    """The HiCache L3 page keys a request of the engine's current epoch would read and write."""
    req = fx.make_req(tokens, extra_key=user_key)
    state.admit_or_raise(req)
    return get_storage_hash_str(RadixKey(tokens, extra_key=req.extra_key), None, page_size=16)


def test_stock_keys_carry_no_weight_identity_so_different_weights_collide():
    """The bug vradix fixes (sglang #26792): without vradix the L3 key of a prompt is built from its tokens and the
    user's keys only, so two engines on different weights compute the same keys for it. The key is no constant: other
    tokens, or a namespace in `extra_key` (what vradix stamps), give other keys."""
    keys = []
    for _ in range(2):  # two separately started engines, neither versioned: nothing of their weights reaches a request
        fx = build_cache("rust", 1, kv_tokens=256, max_reqs=4)
        req = fx.make_req(TOKENS)
        assert req.extra_key is None
        keys.append(get_storage_hash_str(RadixKey(list(req.origin_input_ids), extra_key=req.extra_key), None,
                                         page_size=16))
    assert len(keys[0]) == len(TOKENS) // 16 and len(set(keys[0])) == len(keys[0])
    assert keys[0] == keys[1]
    other_tokens = get_storage_hash_str(RadixKey([t + 1 for t in TOKENS]), None, page_size=16)
    namespaced = get_storage_hash_str(RadixKey(TOKENS, extra_key=identity.namespace("nonce:00")), None, page_size=16)
    assert not set(keys[0]) & set(other_tokens) and not set(keys[0]) & set(namespaced)


def test_restarted_engines_with_nonce_identities_never_share_storage_keys():
    (fx1, s1), (fx2, s2) = engine(), engine()
    assert s1.epoch == s2.epoch == 0 and s1.weight_id != s2.weight_id
    assert not set(storage_keys(fx1, s1)) & set(storage_keys(fx2, s2))


@pytest.mark.parametrize("make", [lambda: identity.declared("run-7/step-12"), lambda: identity.proven("ab" * 16)])
def test_equal_declared_or_proven_identities_share_storage_keys_across_restarts(make):
    (fx1, s1), (fx2, s2) = engine(make()), engine(make())
    assert storage_keys(fx1, s1) == storage_keys(fx2, s2)
    assert storage_keys(fx1, s1, user_key="tenant") != storage_keys(fx2, s2)  # user namespaces stay apart


def test_different_declared_identities_never_share_storage_keys():
    (fx1, s1), (fx2, s2) = engine(identity.declared("run-7/step-12")), engine(identity.declared("run-7/step-13"))
    assert not set(storage_keys(fx1, s1)) & set(storage_keys(fx2, s2))


def test_each_epoch_has_its_own_namespace_and_a_flush_keeps_the_weight_id():
    fx, state = engine(identity.declared("step-1"))
    keys0 = storage_keys(fx, state)
    pub = state.bump(fx.cache, [], [], reason="test publication", identity=identity.declared("step-2"))
    assert pub.weight_id == state.weight_id == "declared:step-2"
    flush = state.bump(fx.cache, [], [], reason="lock-aware flush", is_publication=False)
    assert flush.weight_id == "declared:step-2" and state.epoch == 2
    prefixes = {state.prefix_of_epoch(e) for e in range(3)}
    assert len(prefixes) == 3, "two epochs of one process share a namespace"
    for e in range(3):
        assert state.epoch_of(state.prefix_of_epoch(e) + "user") == e
    # the same weights published again in one process: a new namespace, still built from their identity
    state.bump(fx.cache, [], [], reason="republish", identity=identity.declared("step-1"))
    assert "step-1" in state.prefix_of_epoch(3) and state.prefix_of_epoch(3) != state.prefix_of_epoch(0)
    assert storage_keys(fx, state) != keys0


def test_a_publication_without_an_identity_gets_a_fresh_nonce():
    fx, state = engine()
    seen = {state.weight_id}
    for _ in range(5):
        seen.add(state.bump(fx.cache, [], [], reason="publication").weight_id)
    assert len(seen) == 6 and all(w.startswith("nonce:") for w in seen)


def ranks_of_one_launch(n, instance_id="4f2a9c0d1e7b", detokenizer="ipc:///tmp/launch-a"):
    """`n` scheduler ranks of one engine, each attached as vradix's startup attaches it: its own real cache, its nonces
    seeded from the launch arguments SGLang hands every rank (`PortArgs.instance_id`, the detokenizer address)."""
    port_args = types.SimpleNamespace(instance_id=instance_id, detokenizer_ipc_name=detokenizer)
    out = []
    for _ in range(n):
        fx = build_cache("rust", 1, kv_tokens=256, max_reqs=4)
        nonces = identity.EngineNonces(identity.launch_seed(port_args))
        out.append((fx, attach(fx.cache, identity_mode="nonce", nonces=nonces)))
    return out


def test_every_rank_of_one_engine_reports_one_nonce_identity_at_startup_and_after_each_publication():
    """The ranks of a TP / DP engine are separate processes; each draws its nonces from the engine's launch seed, so
    they report one `weight_id` (the publish client fails a publication whose ranks disagree), and no collective runs
    at the publication."""
    ranks = ranks_of_one_launch(2)
    assert len({s.weight_id for _, s in ranks}) == 1
    seen = {ranks[0][1].weight_id}
    for _ in range(3):
        ids = {s.bump(fx.cache, [], [], reason="publication").weight_id for fx, s in ranks}
        assert len(ids) == 1, ids
        seen |= ids
    flushed = {s.bump(fx.cache, [], [], reason="flush", is_publication=False).weight_id for fx, s in ranks}
    assert flushed == {ranks[0][1].weight_id} and len(seen) == 4  # a flush keeps the weights; every epoch its own


def test_two_launches_never_share_a_nonce_identity():
    (_, a), = ranks_of_one_launch(1)
    (_, b), = ranks_of_one_launch(1, instance_id="0b3c5d7e9f11")
    (_, c), = ranks_of_one_launch(1, detokenizer="ipc:///tmp/launch-b")
    assert len({a.weight_id, b.weight_id, c.weight_id}) == 3
    assert all(w.startswith("nonce:") and len(w) == len("nonce:") + 32 for w in (a.weight_id, b.weight_id))


def test_without_launch_arguments_each_engine_draws_its_own_seed():
    seeds = {identity.launch_seed(None) for _ in range(3)} | {identity.launch_seed(types.SimpleNamespace())}
    assert len(seeds) == 4


@pytest.mark.parametrize("text,why", [("", "empty"), ("   ", "empty"), ("x" * 129, "129 characters"),
                                      ("a\nb", "control characters"), (7, "expected a string")])
def test_bad_declared_identities_are_refused(text, why):
    with pytest.raises(identity.InvalidIdentityError, match=why):
        identity.declared(text)


def test_bad_identity_mode_is_refused():
    with pytest.raises(settings.SettingsError, match="expected one of auto, nonce, fingerprint, declared"):
        identity.mode_from_env({identity.ENV: "sometimes"})
    assert identity.mode_from_env({}) == "auto"


@pytest.mark.parametrize("role,mode", [("prefill", "fingerprint"), ("decode", "fingerprint"), ("null", "nonce"),
                                       (None, "nonce")])
def test_auto_is_fingerprint_on_a_pd_role_and_nonce_elsewhere(role, mode):
    assert identity.resolve_mode("auto", role) == mode
    for explicit in ("nonce", "fingerprint", "declared"):
        assert identity.resolve_mode(explicit, role) == explicit


def test_server_flag_sets_the_mode_for_scheduler_processes(models, monkeypatch):
    """`--vradix-weight-identity` is accepted by SGLang's own parser and exported to the environment the scheduler
    processes inherit; an invalid value is argparse's usage error."""
    monkeypatch.delenv(identity.ENV, raising=False)
    prepare_server_args(["--model-path", models[0], "--vradix-weight-identity", "declared"])
    assert os.environ[identity.ENV] == "declared"
    with pytest.raises(SystemExit):
        prepare_server_args(["--model-path", models[0], "--vradix-weight-identity", "bogus"])


def test_the_weight_id_is_read_back_from_any_stamped_key():
    fx, state = engine(identity.declared("step-1"))
    state.bump(fx.cache, [], [], reason="flush", is_publication=False)  # same weights, suffixed namespace
    for e in range(2):
        assert identity.weight_id_of(state.prefix_of_epoch(e) + "tenant") == "declared:step-1"
    assert identity.weight_id_of("tenant") is None and identity.weight_id_of(None) is None
