"""LoRA identity beyond one process: an adapter is identified by its content, and every key that
leaves the process carries that identity.

SGLang 0.5.23 does not serve LoRA on its CPU engine (its LoRA layers pin host memory, which needs a CUDA driver), so
these tests run at the cache level on SGLang's real objects: adapters are SGLang's own `LoRAAdapter`, loaded by its
model loader from PEFT files this test writes (`vradix.testing.models.llama.generate_lora`); `--lora-paths` ids are
SGLang's own `LoRARef.deterministic_id`; requests are real `Req`s admitted through vradix's installed admission hook;
the L3 store is SGLang's `HiCacheFile` behind its real HiCache controller
(`vradix.testing.harness.l3_store.file_store_cache`); the handshake rows are SGLang's real `MetadataBuffers`. A
scheduler stand-in (`lora_scheduler`) exposes the loaded adapters where SGLang's scheduler holds them
(`tp_worker.model_runner.lora_manager.loras`).

The oracle for each bug is what stock SGLang computes: the key a LoRA request carries without vradix (its `lora_id`)
seeds the same L3 page hashes after a retrain, and the identity SGLang would compare carries no adapter at all.
"""
from __future__ import annotations

import types
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.srt.lora.lora_registry import LoRARef
from sglang.srt.runtime_context import get_parallel

from vradix import identity, request
from vradix.core import lora, reclaim
from vradix.hooks import pd as pd_hooks
from vradix.hooks.serving import admit
from vradix.identity import ReservedNamespaceError
from vradix.pd import handshake
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.l3_store import (PROMPT, StorageScheduler, backend_hits, file_store_cache, start_prefetch,
                                             store_pages)
from vradix.testing.models.llama import generate_lora, load_lora_adapter

#: a fingerprint identity: equal base weights give it in every process, across restarts
BASE = identity.proven("ab" * 16)


def lora_scheduler(fx, adapters: dict, view_class=StorageScheduler):
    """The fixture's scheduler view, with SGLang's loaded adapters where the scheduler holds them."""
    view = view_class(fx)
    view.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
        lora_manager=types.SimpleNamespace(loras=adapters)))
    return view


def boot(fx, path, lora_id):
    """A (re)started engine on the BASE weights with adapter `path` loaded as `lora_id`: a fresh Engine on the
    cache, and its scheduler view holding SGLang's LoRAAdapter read from `path` now."""
    state = attach(fx.cache, with_ledger=False, weight_identity=BASE, identity_mode="fingerprint")
    return state, lora_scheduler(fx, {lora_id: load_lora_adapter(str(path), lora_id)})


def admitted(fx, sched, tokens, lora_id):
    """A LoRA request through vradix's installed admission hook (as the scheduler admits it)."""
    req = fx.make_req(tokens, lora_id=lora_id)
    admit(sched, req)
    return req


# ---- L3: a restart after the adapter was retrained at the same path --------------------------------------------
@pytest.mark.parametrize("tree_core", ["rust", "python"])
def test_a_retrained_adapter_at_the_same_path_never_reads_the_old_adapters_l3_pages(tmp_path, tree_core):
    """`--lora-paths X=<path>` with a fingerprint identity and a `file` L3 store. Boot 1 stores a prompt's KV computed
    with X. A restart with the same X file finds every page (L3 reuse across restarts is kept); a restart after X was
    retrained at the same path finds none, where stock SGLang's key (the `lora_id`, `uuid5(name, path)`) finds them
    all."""
    path = generate_lora(str(tmp_path / "adapter-X"), seed=1)
    lora_id = LoRARef.deterministic_id("X", path)
    tokens = PROMPT + [7, 8, 9, 10]
    with file_store_cache(tmp_path / "store", tree_core) as fx:
        stock_key = fx.make_req(tokens, lora_id=lora_id).extra_key  # what SGLang alone keys it by
        assert stock_key == lora_id
        store_pages(fx, PROMPT, stock_key)  # a stock boot 1
        state, sched = boot(fx, path, lora_id)
        first = admitted(fx, sched, tokens, lora_id)
        assert first.extra_key.endswith(lora_id) and identity.weight_id_of(first.extra_key) == BASE.weight_id
        store_pages(fx, PROMPT, first.extra_key)  # boot 1 with vradix
        reclaim.free_all_by_reset(fx.cache)  # the pages are in L3 only

        state, sched = boot(fx, path, lora_id)  # restart, X unchanged
        same = admitted(fx, sched, tokens, lora_id)
        assert same.extra_key == first.extra_key
        assert backend_hits(fx.cache, PROMPT, same.extra_key) == len(PROMPT)
        op = start_prefetch(StorageScheduler(fx, waiting=[same]), same)  # SGLang's own lookup hits
        assert len(op.host_indices) == len(PROMPT)

        generate_lora(path, seed=2)  # X retrained, written to the same path
        assert LoRARef.deterministic_id("X", path) == lora_id
        assert backend_hits(fx.cache, PROMPT, stock_key) == len(PROMPT)  # the bug: stock reads old-X pages
        state, sched = boot(fx, path, lora_id)  # restart with the retrained X
        retrained = admitted(fx, sched, tokens, lora_id)
        assert identity.weight_id_of(retrained.extra_key) == BASE.weight_id and retrained.extra_key.endswith(lora_id)
        assert backend_hits(fx.cache, PROMPT, retrained.extra_key) == 0, "the retrained X reads old-X pages"
        assert request.of(retrained).adapter != request.of(same).adapter


def test_the_adapter_tag_is_the_adapters_content_and_no_user_key_can_forge_it(tmp_path):
    """Within a process, a request's tag is its adapter's content identity: equal files under two lora_ids (two
    loads) get one identity, a changed config (alpha) or a retrained file another; an adapter vradix was never shown gets a nonce (never shared
    across processes). A base-model request whose user key spells a LoRA key is refused."""
    path = generate_lora(str(tmp_path / "X"), seed=1)
    fx = build_cache("rust", 1, kv_tokens=256)
    state = attach(fx.cache, weight_identity=BASE, identity_mode="fingerprint")
    one, two, unknown = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    loras = {one: load_lora_adapter(path, one), two: load_lora_adapter(path, two)}
    generate_lora(path, seed=1, alpha=16)  # the same tensors, another scaling
    rescaled = uuid.uuid4().hex
    loras[rescaled] = load_lora_adapter(path, rescaled)
    generate_lora(path, seed=2)
    retrained = uuid.uuid4().hex
    loras[retrained] = load_lora_adapter(path, retrained)
    sched = lora_scheduler(fx, loras)
    reqs = {lid: admitted(fx, sched, [5, 6, 7], lid) for lid in (one, two, rescaled, retrained, unknown)}
    ids = {lid: request.of(r).adapter for lid, r in reqs.items()}
    assert ids[one] == ids[two] == lora.content_identity(loras[one])
    assert len({ids[one], ids[rescaled], ids[retrained]}) == 3
    assert ids[unknown].startswith("lora-nonce:")
    tag = identity.adapter_tag(ids[one])
    assert reqs[one].extra_key == state.prefix_of_epoch(0) + tag + one
    forged = fx.make_req([5, 6, 7], extra_key=tag + one)  # a base request spelling adapter one's key
    with pytest.raises(ReservedNamespaceError):
        state.admit_or_raise(forged)


def test_a_lora_request_refused_for_a_forged_key_stays_out_of_the_base_namespace(tmp_path):
    """A LoRA request whose user key forges the reserved marker is aborted, but bound without that key; it keeps its
    adapter tag, so whatever SGLang computes for it with the adapter cannot land in the base model's namespace."""
    path = generate_lora(str(tmp_path / "X"), seed=1)
    fx = build_cache("rust", 1, kv_tokens=256)
    state = attach(fx.cache, weight_identity=BASE, identity_mode="fingerprint")
    sched = lora_scheduler(fx, {"X-1": load_lora_adapter(path, "X-1")})
    req = fx.make_req([5, 6, 7], extra_key=identity.namespace("fp:forged"), lora_id="X-1")
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):  # what SGLang's abort reads
        admit(sched, req)
    assert req.to_finish is not None and state.forged_keys_rejected == 1  # SGLang aborts it after one token
    base = fx.make_req([5, 6, 7])
    admit(sched, base)
    assert req.extra_key != base.extra_key, "the refused LoRA request was bound to the base model's namespace"
    assert identity.adapter_tag(state.lora.adapter_ids["X-1"]) in req.extra_key


# ---- P/D: an adapter reloaded on one role before the other -------------------------------------------------------
class Receiver:
    """The decode request's KV receiver, as far as the commit path touches it."""

    cleared = False

    def clear(self):
        self.cleared = True


def role(adapter_path):
    """One P/D role on the BASE weights with adapter X loaded from `adapter_path` under the role's own lora_id (each
    role's tokenizer mints a uuid4 per load)."""
    fx = build_cache("rust", 1, kv_tokens=256)
    lora_id = uuid.uuid4().hex
    state, sched = boot(fx, adapter_path, lora_id)
    return fx, sched, lora_id


def handoff(prefill, decode, room=4242):
    """Prefill computes a LoRA request and writes its identity into a real MetadataBuffers row (the installed hook);
    decode's commit hook then reads it for decode's own request. Returns (committed?, decode request, receiver)."""
    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    (pfx, psched, plid), (dfx, dsched, dlid) = prefill, decode
    bufs = MetadataBuffers(4, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=4)
    sent = admitted(pfx, psched, PROMPT, plid)
    sent.metadata_buffer_index = 1
    bufs.bootstrap_room[1, 0] = room
    pd_hooks.send_prefill_identity(None, bufs, sent)
    got = admitted(dfx, dsched, PROMPT, dlid)
    got.bootstrap_host, got.bootstrap_room = "10.0.0.2", room
    receiver = Receiver()
    decode_req = types.SimpleNamespace(req=got, metadata_buffer_index=1, kv_receiver=receiver, prefix_match=None)
    commits = []
    pd_hooks.check_prefill_identity(lambda q, d, *a, **k: commits.append(d), types.SimpleNamespace(
        metadata_buffers=bufs, tree_cache=dfx.cache), decode_req)
    return bool(commits), got, receiver


def test_decode_refuses_kv_prefill_computed_with_an_adapter_content_decode_does_not_serve(tmp_path):
    """Both roles on the same weights, each with its own lora_id for X. With the same X files the handoff commits
    (the lora_ids differ, the content does not). After decode reloaded X from a retrained file while prefill still
    serves the old X, decode refuses prefill's KV with a 503 naming both sides, and releases it uncommitted."""
    old = generate_lora(str(tmp_path / "X-old"), seed=1)
    new = generate_lora(str(tmp_path / "X-new"), seed=2)
    prefill = role(old)
    committed, got, receiver = handoff(prefill, role(old))
    assert committed and got.finished_reason is None and not receiver.cleared
    committed, got, receiver = handoff(prefill, role(new))
    assert not committed, "decode committed KV prefill computed with the old adapter"
    assert receiver.cleared and got.finished_reason.status_code == 503
    message = got.finished_reason.message
    assert "weight-identity mismatch" in message and BASE.weight_id in message
    assert request.of(got).adapter in message and "identified by its content" in message


FP_A, FP_B = "fp:" + "a" * 64, "fp:" + "b" * 64


def test_handshake_names_the_adapter_side_of_a_mismatch():
    base = handshake.decode(handshake.encode([FP_A]))
    with_x = handshake.decode(handshake.encode([FP_A], "lora:x"))
    assert with_x.adapter and not base.adapter and with_x.digest != base.digest
    assert handshake.mismatch(with_x, FP_A, "r", "lora:x") is None
    assert "without a LoRA adapter" in handshake.mismatch(base, FP_A, "r", "lora:x")
    assert "with a LoRA adapter" in handshake.mismatch(with_x, FP_A, "r")
    assert "'lora:y'" in handshake.mismatch(with_x, FP_A, "r", "lora:y")


ADAPTERS = st.one_of(st.none(), st.text(min_size=1, max_size=40))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=140), ADAPTERS, st.text(min_size=1, max_size=140), ADAPTERS)
def test_the_handshake_passes_exactly_when_weights_and_adapter_content_are_equal(p_wid, p_adapter, d_wid, d_adapter):
    verdict = handshake.mismatch(handshake.decode(handshake.encode([p_wid], p_adapter)), d_wid, "r", d_adapter)
    assert (verdict is None) == (p_wid == d_wid and p_adapter == d_adapter)
