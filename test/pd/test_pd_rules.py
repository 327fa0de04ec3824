"""P/D rules at unit level (no server): bad decode input (`vradix.pd.bootstrap`), the restore-policy rule
(`vradix.pd.restore_policy`), role-local L3 namespaces (`vradix.pd.layout`) and the weight-identity handshake
(`vradix.pd.handshake`, written into and read back from SGLang's real `MetadataBuffers` row) and the revocation
rule for decode's unfulfilled promises at a publication (`vradix.pd.revocation`). The startup and attach hooks run
in-process on SGLang's real `ServerArgs` (resolved as a launcher resolves it) through the installed HOOKS; the same
checks on live servers are in `test_e2e_pd.py`."""
import asyncio
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vradix import identity
from vradix.core import provenance
from vradix.pd import bootstrap, handshake, layout, restore_policy, revocation
from vradix.pd.layout import IncompatibleLayoutError, KvLayout
from vradix.request import HistoryEntry as H

# ---- bad input: bootstrap fields ---------------------------------------------------------------------------------


@pytest.mark.parametrize("host,port,room,named", [
    (None, None, 7, ["bootstrap_host is missing", "bootstrap_port is missing"]),
    (None, None, None, ["bootstrap_host", "bootstrap_port", "bootstrap_room is missing"]),
    ("", 8998, 7, ["bootstrap_host='' is not a host name"]),
    ("127.0.0.1", 0, 7, ["bootstrap_port=0"]),
    ("127.0.0.1", True, 7, ["bootstrap_port=True"]),
    ("127.0.0.1", "8998", 7, ["bootstrap_port='8998'"]),
    ("127.0.0.1", 8998, -1, ["bootstrap_room=-1"]),
    ("127.0.0.1", 8998, 2 ** 64, ["bootstrap_room="]),
])
def test_a_decode_request_without_usable_bootstrap_fields_is_refused_naming_them(host, port, room, named):
    with pytest.raises(bootstrap.MissingBootstrapError) as e:
        bootstrap.check_decode_request(host, port, room, "mooncake")
    assert all(n in str(e.value) for n in named), str(e.value)
    assert isinstance(e.value, ValueError)  # SGLang's HTTP layer answers a ValueError with 400


def test_usable_bootstrap_fields_pass_and_fake_transfer_may_omit_the_room():
    bootstrap.check_decode_request("127.0.0.1", 8998, 0, "mooncake")
    bootstrap.check_decode_request("::1", 65535, 2 ** 64 - 1, "mooncake")
    bootstrap.check_decode_request("2.2.2.2", 8998, None, "fake")  # the engine assigns the room itself
    with pytest.raises(bootstrap.MissingBootstrapError, match="bootstrap_host is missing"):
        bootstrap.check_decode_request(None, 8998, None, "fake")  # ... but never the host


# ---- restore policy ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role,dcp,backend,policy,refused", [
    ("decode", 1, "file", "best_effort", True),
    ("decode", 1, "mooncake", "timeout", True),
    ("decode", 1, "file", "wait_complete", False),
    ("decode", 1, None, "timeout", False),          # no L3: the prefetch policy is never used
    ("prefill", 1, "file", "timeout", False),
    ("null", 4, "file", "timeout", True),           # DCP restores must finish on every shard
    ("decode", 4, "file", "best_effort", True),
    ("prefill", 2, "file", "wait_complete", False),
    ("null", 1, "file", "best_effort", False),
])
def test_restore_policy_rule(role, dcp, backend, policy, refused):
    if refused:
        with pytest.raises(restore_policy.RestorePolicyError, match=f"requires --hicache-storage-prefetch-policy "
                                                                     f"wait_complete, got '{policy}'"):
            restore_policy.check(role, dcp, backend, policy)
    else:
        restore_policy.check(role, dcp, backend, policy)


def test_the_attach_policy_is_the_requested_one_else_the_configured_one():
    assert restore_policy.effective_policy(None, "timeout") == "timeout"
    assert restore_policy.effective_policy("wait_complete", "timeout") == "wait_complete"
    assert restore_policy.effective_policy("best_effort", "wait_complete") == "best_effort"


def decode_server_args(model, policy, **extra):
    """A decode-role ServerArgs with decode radix, HiCache and `file` L3, resolved as the launcher resolves it."""
    from sglang.srt.server_args import ServerArgs
    sa = ServerArgs(model_path=model, device="cpu", disaggregation_mode="decode",
                    disaggregation_transfer_backend="mooncake_tcp", disaggregation_decode_enable_radix_cache=True,
                    enable_hierarchical_cache=True, hicache_io_backend="direct", hicache_mem_layout="layer_first",
                    hicache_storage_prefetch_policy=policy, attention_backend="torch_native",
                    skip_tokenizer_init=True, **extra)
    sa.resolve_once()
    return sa


def test_a_decode_role_with_l3_starts_only_with_wait_complete(models, monkeypatch):
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setenv(identity.ENV, "fingerprint")
    bad = decode_server_args(models[0], "best_effort", hicache_storage_backend="file")
    with pytest.raises(restore_policy.RestorePolicyError, match="decode-role engine with HiCache L3 storage"):
        bad.check_server_args()  # the launcher's validation; the vradix hook runs after SGLang's own checks
    decode_server_args(models[0], "wait_complete", hicache_storage_backend="file").check_server_args()
    decode_server_args(models[0], "timeout").check_server_args()  # no L3 at startup: nothing to restore yet


@pytest.mark.parametrize("role, mode, version, refused", [
    ("decode", "nonce", "default", "the nonce identity"),
    ("prefill", "nonce", "step1", "the nonce identity"),
    ("decode", "declared", "default", "--weight-version is 'default'"),
    ("prefill", "declared", "run1-step0", None),
    ("decode", "fingerprint", "default", None),
    (None, "nonce", "default", None),
    ("null", "declared", "default", None),
])
def test_role_identity_rule(role, mode, version, refused):
    if refused is None:
        handshake.check_role_identity(role, mode, version)
        return
    with pytest.raises(handshake.RoleIdentityError) as e:
        handshake.check_role_identity(role, mode, version)
    assert refused in str(e.value) and f"a {role}-role engine" in str(e.value)
    assert "--vradix-weight-identity fingerprint" in str(e.value)


def test_a_pd_role_starts_only_with_an_identity_both_roles_share(models, monkeypatch):
    """The launcher's validation on real ServerArgs: the hook reads the exported identity mode."""
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    for mode, version in (("nonce", "default"), ("declared", "default")):
        monkeypatch.setenv(identity.ENV, mode)
        with pytest.raises(handshake.RoleIdentityError, match="decode-role engine needs a weight identity"):
            decode_server_args(models[0], "wait_complete", weight_version=version).check_server_args()
    monkeypatch.setenv(identity.ENV, "declared")
    decode_server_args(models[0], "wait_complete", weight_version="run1-step0").check_server_args()
    monkeypatch.setenv(identity.ENV, "fingerprint")
    decode_server_args(models[0], "wait_complete").check_server_args()


class AttachOnly:
    """The attach call's receiver: a real ServerArgs; anything past the vradix check reaches SGLang's own attach,
    which needs a live engine (`auto_create_handle_loop`) and so raises AttributeError here."""

    def __init__(self, server_args):
        self.server_args = server_args


def test_a_runtime_attach_with_another_policy_is_refused_before_any_scheduler(models, monkeypatch):
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    tm = AttachOnly(decode_server_args(models[0], "timeout"))  # started without L3, configured policy `timeout`

    def attach(**kw):
        return asyncio.run(TokenizerControlMixin.attach_hicache_storage(tm, hicache_storage_backend="file", **kw))

    for requested in (None, "best_effort", "timeout"):  # None: the server's own `timeout` applies
        out = attach(hicache_storage_prefetch_policy=requested)
        assert out.success is False and "requires --hicache-storage-prefetch-policy wait_complete" in out.message
    with pytest.raises(AttributeError, match="auto_create_handle_loop"):  # accepted: reaches SGLang's attach
        attach(hicache_storage_prefetch_policy="wait_complete")


# ---- role-local L3 namespaces --------------------------------------------------------------------------------------

PREFILL = KvLayout("prefill", 4, 1, 64, "bfloat16")
DECODE = KvLayout("decode", 4, 4, 64, "float8_e4m3fn", is_mla=True)


def test_scope_names_role_and_layout():
    assert layout.scope_of(PREFILL) == "prefill.tp4.dcp1.ps64.bfloat16"
    assert layout.scope_of(DECODE) == "decode.tp4.dcp4.ps64.float8_e4m3fn.mla"
    ns = layout.l3_namespace(DECODE, "declared:run1-step5")
    assert ns == "\x1evradix:decode.tp4.dcp4.ps64.float8_e4m3fn.mla\x1cdeclared:run1-step5\x1f"
    assert identity.prefix_of(ns + "user") == ns
    assert identity.weight_id_of(ns + "user") == "declared:run1-step5"
    assert identity.weight_id_of(layout.l3_namespace(DECODE, "fp:ab", 3)) == "fp:ab"
    assert layout.scope_in(ns) == layout.scope_of(DECODE) and layout.scope_in(identity.namespace("fp:ab")) is None


def test_layout_from_real_server_args(models, monkeypatch):
    import torch
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    sa = decode_server_args(models[0], "wait_complete", hicache_storage_backend="file")
    assert layout.scope_of(layout.layout_of(sa, torch.float32)) == "decode.tp1.dcp1.ps1.float32"  # page size: SGLang default 1
    assert layout.role_of("null") == "unified" and layout.role_of(None) == "unified"


layouts = st.builds(KvLayout, role=st.sampled_from(layout.ROLES), tp_size=st.integers(1, 16),
                    dcp_size=st.integers(1, 16), page_size=st.sampled_from([1, 16, 32, 64, 128]),
                    kv_dtype=st.sampled_from(["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"]),
                    is_mla=st.booleans())


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(a=layouts, b=layouts, wa=st.sampled_from(["fp:1", "declared:x.tp1", "nonce:2"]),
       wb=st.sampled_from(["fp:1", "declared:x.tp1", "nonce:2"]))
def test_different_layouts_never_share_a_namespace(a, b, wa, wb):
    assert layout.parse_scope(layout.scope_of(a)) == a
    if (a, wa) != (b, wb):
        assert layout.l3_namespace(a, wa) != layout.l3_namespace(b, wb)
    if a != b:
        with pytest.raises(IncompatibleLayoutError, match="cross-layout conversion is unsupported"):
            layout.check_compatible(a, b)
    else:
        layout.check_compatible(a, b)


def test_a_role_never_reads_the_other_roles_objects_even_with_an_equal_layout():
    twin = KvLayout("decode", PREFILL.tp_size, PREFILL.dcp_size, PREFILL.page_size, PREFILL.kv_dtype)
    with pytest.raises(IncompatibleLayoutError, match="role 'decode' != 'prefill'"):
        layout.check_compatible(twin, PREFILL)


@pytest.mark.parametrize("bad,why", [
    (KvLayout("decode", 4, 4, 64, "bfloat16"), "needs an MLA model"),
    (KvLayout("decode", 6, 4, 64, "bfloat16", True), "does not divide tp_size"),
    (KvLayout("decode", 4, 4, 2, "bfloat16", True), "does not divide page_size"),
    (KvLayout("decode", 1, 1, 1, "auto"), "not a resolved dtype"),
    (KvLayout("router", 1, 1, 1, "bfloat16"), "unknown role"),
    (KvLayout("decode", 0, 1, 1, "bfloat16"), "tp_size=0"),
])
def test_a_layout_l3_cannot_serve_is_refused(bad, why):
    with pytest.raises(IncompatibleLayoutError, match=why):
        layout.check_layout(bad)


def test_a_layout_l3_can_serve_passes():
    layout.check_layout(PREFILL)
    layout.check_layout(DECODE)


def test_sglangs_own_health_and_warmup_requests_pass():
    """`/health_generate` and the disaggregation warmup send the fake bootstrap host, room 0 and no port."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    assert bootstrap.FAKE_BOOTSTRAP_HOST == FAKE_BOOTSTRAP_HOST
    bootstrap.check_decode_request(FAKE_BOOTSTRAP_HOST, None, 0, "mooncake")


# ---- the weight-identity handshake ---------------------------------------------------------------------------------

FP_A, FP_B = "fp:" + "a" * 64, "fp:" + "b" * 64


def test_equal_identities_pass_and_every_other_case_is_refused_naming_both():
    assert handshake.mismatch(handshake.decode(handshake.encode([FP_A])), FP_A, "r1") is None
    other = handshake.mismatch(handshake.decode(handshake.encode([FP_A])), FP_B, "r1")
    assert "request r1" in other and FP_A[:32] in other and FP_B in other and "retry" in other
    mixed = handshake.mismatch(handshake.decode(handshake.encode([FP_B, FP_A])), FP_A, "r2")
    assert "across a publication" in mixed  # prefill's KV spans two weights: refused even though the last matches
    missing = handshake.mismatch(handshake.decode(bytes(handshake.SIZE)), FP_A, "r3")
    assert "no weight identity" in missing  # a prefill without vradix writes zeros
    assert "fingerprint or declared" in handshake.mismatch(None, "nonce:" + "0" * 32, "r4")
    assert "fingerprint or declared" not in missing


def test_prefill_sends_the_identities_of_the_prompt_positions_only():
    assert handshake.sent_weight_ids([H(0, 0, "A", FP_A)], 10) == [FP_A]
    assert handshake.sent_weight_ids([H(0, 0, "A", FP_A), H(4, 1, "B", FP_B)], 10) == [FP_A, FP_B]  # crossed mid-prompt
    assert handshake.sent_weight_ids([H(0, 0, "A", FP_A), H(10, 1, "B", FP_B)], 10) == [FP_A]  # crossed after it


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=140), min_size=1, max_size=3), st.text(min_size=1, max_size=140))
def test_the_handshake_passes_exactly_when_prefill_kv_is_all_under_decodes_identity(prefill_ids, decode_id):
    verdict = handshake.mismatch(handshake.decode(handshake.encode(prefill_ids)), decode_id, "r")
    assert (verdict is None) == (set(prefill_ids) == {decode_id})


def test_prefill_identity_round_trips_through_sglangs_metadata_row_without_touching_the_room():
    """The prefill hook writes into a real `MetadataBuffers` row; the bytes that travel (get_buf) decode back, and
    slot 0 (SGLang's bootstrap_room check) is what SGLang wrote."""
    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    from vradix import request
    from vradix.hooks import pd as pd_hooks

    bufs = MetadataBuffers(4, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=4)
    req = types.SimpleNamespace(metadata_buffer_index=2, rid="r", origin_input_ids=list(range(10)))
    bufs.bootstrap_room[2, 0] = 12345
    pd_hooks.send_prefill_identity(None, bufs, req)  # not admitted by vradix: writes nothing
    assert handshake.decode(bufs.get_buf(2)[-1].view(torch.uint8)[8:].numpy().tobytes()) is None
    request.attach(req, None, request.HistoryEntry(0, 0, "A", FP_A))
    pd_hooks.send_prefill_identity(None, bufs, req)
    row = bufs.get_buf(2)[-1]
    assert int(row[0].item()) == 12345
    sent = handshake.decode(row.view(torch.uint8)[8:].numpy().tobytes())
    assert sent == handshake.PrefillIdentity(handshake.digest(FP_A), FP_A[:32], False)
    bufs.clear_slot(2)  # decode resets a slot for its next owner: no identity survives
    assert handshake.decode(bufs.get_buf(2)[-1].view(torch.uint8)[8:].numpy().tobytes()) is None


def spans_of(promised, prompt, generated, history):
    return [(s["role"], s["start"], s["end"], s["weight_id"])
            for s in provenance.role_spans(promised, "P", prompt, generated, history)]


def test_pd_spans_name_each_roles_span_and_split_decode_where_it_crossed_a_publication():
    a, b = H(0, 0, "A", "idA"), H(603, 1, "B", "idB")
    assert spans_of(100, 600, 6, [a]) == [("decode_cache", 0, 100, "idA"), ("prefill", 100, 600, "P"),
                                          ("decode", 600, 606, "idA")]
    assert spans_of(0, 600, 6, [a]) == [("prefill", 0, 600, "P"), ("decode", 600, 606, "idA")]
    # crossed while decoding: decode's positions before the publication were computed under A, the rest under B
    assert spans_of(0, 600, 6, [a, b])[-2:] == [("decode", 600, 603, "idA"), ("decode", 603, 606, "idB")]
    # crossed while receiving prefill's KV (the crossing is recorded inside the prompt): decode computed all under B
    assert spans_of(0, 600, 6, [a, H(100, 1, "B", "idB")])[-1] == ("decode", 600, 606, "idB")
    # bumps that keep the identity (a lock-aware flush) do not split a span
    assert spans_of(0, 600, 6, [a, H(602, 1, "A", "idA")])[-1] == ("decode", 600, 606, "idA")


@given(promised=st.integers(0, 50), prompt=st.integers(1, 50), generated=st.integers(0, 50),
       cuts=st.lists(st.integers(1, 120), max_size=4), ids=st.lists(st.sampled_from("ab"), min_size=5, max_size=5))
@settings(max_examples=200, deadline=None)
def test_pd_spans_are_ordered_disjoint_and_cover_every_position(promised, prompt, generated, cuts, ids):
    promised = min(promised, prompt)
    history = [H(0, 0, None, ids[0])] + [H(c, i + 1, None, ids[i + 1]) for i, c in enumerate(sorted(set(cuts)))]
    spans = provenance.role_spans(promised, "P", prompt, generated, history)
    assert spans[0]["start"] == 0 and spans[-1]["end"] == prompt + generated
    assert all(x["end"] == y["start"] for x, y in zip(spans, spans[1:]))
    assert all(s["end"] > s["start"] for s in spans)


# ---- revoking decode's unfulfilled promises at a publication -----------------------------------------------------


def test_a_promise_is_revoked_exactly_while_prefill_has_not_reported_it_fulfilled():
    """Against SGLang's real `KVPoll`: only a receiver still Bootstrapping or WaitingForInput is unfulfilled; a
    promise of nothing, a finished request, a fake transfer, or a publication of the same weights revokes nothing."""
    from sglang.srt.disaggregation.base import KVPoll

    def revoked(poll, promised=8, finished=False, fake=False, under="fp:a", published="fp:b"):
        return revocation.must_revoke(poll, promised, finished=finished, fake=fake, promised_under=under,
                                      published=published)

    states = {name: getattr(KVPoll, name) for name in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring",
                                                       "Success")}
    assert {name for name, poll in states.items() if revoked(poll)} == {"Bootstrapping", "WaitingForInput"}
    waiting = KVPoll.WaitingForInput
    assert not revoked(waiting, promised=0) and not revoked(waiting, finished=True) and not revoked(waiting, fake=True)
    assert not revoked(waiting, under="fp:b")
    why = revocation.message("rid7", 8, "fp:a", "fp:b", 3)
    assert all(part in why for part in ("rid7", "first 8 prompt", "'fp:a'", "'fp:b'", "epoch 3", "retry"))


def test_a_decode_role_without_a_radix_cache_would_commit_kv_of_any_weights_so_it_does_not_start():
    """SGLang's decode role runs without a radix cache unless --disaggregation-decode-enable-radix-cache is given.
    vradix would run treeless there: no request is bound to an epoch, so the handshake hook has nothing to compare,
    and decode commits KV prefill computed under weights A while it serves B. So that role does not start: the
    launch check names the flag to add, and the engine start refuses a decode role whose tree is disabled."""
    import dataclasses
    import types

    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from vradix.closed_world import unversioned
    from vradix.engine import attach
    from vradix.core.state import attach_treeless
    from vradix.hooks import pd as pd_hooks
    from vradix.hooks import serving
    from vradix.hooks.startup import attach_to_scheduler
    from vradix.testing.harness.cache_fixture import build_cache

    prefill = build_cache("rust", 1, kv_tokens=256)
    pstate = attach(prefill.cache, weight_identity=identity.declared("A"), identity_mode="declared")
    sent = prefill.make_req([5, 6, 7, 8])
    pstate.admit_or_raise(sent)
    prefill.admit(sent)
    prefill.prefill(sent)
    bufs = MetadataBuffers(4, hidden_size=8, hidden_states_dtype=torch.float32, max_sampling_mask_tokens=4)
    sent.metadata_buffer_index, bufs.bootstrap_room[1, 0] = 1, 4242
    pd_hooks.send_prefill_identity(None, bufs, sent)

    disabled = build_cache("rust", 1, kv_tokens=256)
    decode_cache = UnifiedRadixCache(dataclasses.replace(disabled.cache.cache_init_params, disable=True))
    decode = types.SimpleNamespace(tree_cache=decode_cache,
                                   server_args=types.SimpleNamespace(disaggregation_mode="decode"))
    attach_treeless(decode_cache)  # what an engine without the refusal runs (it serves B: no identity is kept)
    got = disabled.make_req([5, 6, 7, 8])
    serving.admit(decode, got)
    got.bootstrap_host, got.bootstrap_room = "10.0.0.2", 4242
    commits = []
    pd_hooks.check_prefill_identity(lambda q, d, *a, **k: commits.append(d),
                                    types.SimpleNamespace(metadata_buffers=bufs, tree_cache=decode_cache),
                                    types.SimpleNamespace(req=got, metadata_buffer_index=1, kv_receiver=None,
                                                          prefix_match=None))
    assert commits and got.finished_reason is None, "the treeless decode role did not commit A's KV"

    with pytest.raises(RuntimeError, match="--disaggregation-decode-enable-radix-cache"):
        attach_to_scheduler(None, decode)
    refused = types.SimpleNamespace(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=False)
    with pytest.raises(unversioned.UnversionedPathError, match="--disaggregation-decode-enable-radix-cache"):
        unversioned.check(refused)
    unversioned.check(types.SimpleNamespace(disaggregation_mode="decode",
                                            disaggregation_decode_enable_radix_cache=True))
    attach_to_scheduler(None, types.SimpleNamespace(tree_cache=decode_cache,
                                                    server_args=types.SimpleNamespace(disaggregation_mode="null")))
