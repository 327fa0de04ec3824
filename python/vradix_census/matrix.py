"""The flag combination matrix: every `versioned` or `refused` field of the flag census (`census.flags.FLAGS`) with
each of the flags in `COLUMNS`, decided.

A cell is `supported` (its tests named; `pair` says whether one of them runs this very combination, or whether each
path is tested alone and the text says why they do not interact), `refused at startup` (the test that shows the
refusal; `by` says which check refuses: `launch` for vradix's launch checks on the combination, `engine start` for
the scheduler's, `its row` for the field's own refusal, whose docs/paths.md row is tested on SGLang's argument
pipeline) or `n/a` (the combination cannot be expressed; the text says why).

Invariants (test/closed_world/test_flag_matrix.py): every such field has a decided cell in every column; every test a
cell names exists; every cell refused at launch because of the combination is refused by vradix's launch checks
(`unversioned.check`, `staleness.check_server`) on the arguments `arguments(field, column)` builds, and no such check
refuses a `supported` cell's arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Dict, Tuple

from vradix_census import flags as F

DECISIONS = ("supported", "refused at startup", "n/a")


@dataclass(frozen=True)
class Cell:
    """One decided combination (see the module docstring)."""

    decision: str
    text: str
    tests: Tuple[str, ...] = ()
    pair: bool = True
    by: str = ""
    #: extra `ServerArgs` fields this cell's combination sets (beyond the row's and the column's)
    args: Dict[str, object] = field(default_factory=dict)


def ok(text: str, *tests: Tuple[str, ...], pair: bool = True) -> Cell:
    return Cell("supported", text, tuple(t for group in tests for t in group), pair)


def refused(text: str, *tests: Tuple[str, ...], by: str = "launch", **args) -> Cell:
    return Cell("refused at startup", text, tuple(t for group in tests for t in group), by=by, args=args)


def na(text: str) -> Cell:
    return Cell("n/a", text)


#: column -> (heading, the `ServerArgs` fields that turn it on, the server window it sets)
COLUMNS: Dict[str, Tuple[str, Dict[str, object], int]] = {
    "radix-off": ("`--disable-radix-cache`", {"disable_radix_cache": True}, 0),
    "window": ("`--vradix-max-staleness` K > 0", {}, 1),
    "ledger-off": ("KV page ledger off (speculative decoding; also the decode host-staged receive, the external "
                   "linker and HiCache pools without epochs, each its own row)", {"speculative_algorithm": "EAGLE"}, 0),
    "streaming": ("`--enable-streaming-session`", {"enable_streaming_session": True}, 0),
    "pd": ("P/D role (`--disaggregation-mode prefill/decode`)",
           {"disaggregation_mode": "decode", "disaggregation_decode_enable_radix_cache": True}, 0),
    "hicache": ("`--enable-hierarchical-cache`", {"enable_hierarchical_cache": True}, 0),
}

#: the value a row's field takes where the combination turns its path on (default True)
ROW_VALUE: Dict[str, object] = {
    "disaggregation_mode": "decode", "speculative_algorithm": "EAGLE", "hicache_host_memory_mode": "buffer_only",
    "hicache_storage_backend": "file", "offload_mode": "meta", "offload_group_size": 2, "elastic_ep_backend": "mooncake",
    "kt_weight_path": "/experts", "dllm_algorithm": "LowConfidence", "speculative_accept_threshold_single": 0.5,
    "speculative_accept_threshold_acc": 0.5, "radix_cache_backend": "foo", "device": "cpu",
    "disaggregation_decode_retraction_backup": "host_pool", "disaggregation_decode_host_receive_threshold": 0.5,
    "lora_paths": ["x=/adapters/x"], "tp_size": 2, "pp_size": 2, "dp_size": 2, "dcp_size": 2,
    "chunked_prefill_size": 512, "page_size": 16, "model_path": "/models/B", "weight_version": "v2",
}
#: fields a row's path needs besides its own (the launch check reads them together)
ROW_NEEDS: Dict[str, Dict[str, object]] = {
    "hicache_host_memory_mode": {"enable_hierarchical_cache": True},
    "hicache_storage_backend": {"enable_hierarchical_cache": True},
    "lora_paths": {"enable_lora": True},
    "disaggregation_decode_enable_radix_cache": {"disaggregation_mode": "decode"},
    "disaggregation_decode_enable_offload_kvcache": {"disaggregation_mode": "decode",
                                                     "disaggregation_decode_enable_radix_cache": True},
    "disaggregation_decode_retraction_backup": {"disaggregation_mode": "decode",
                                                "disaggregation_decode_enable_radix_cache": True},
    "disaggregation_decode_host_receive_threshold": {"disaggregation_mode": "decode",
                                                     "disaggregation_decode_enable_radix_cache": True},
    "disaggregation_mode": {"disaggregation_decode_enable_radix_cache": True},
    "speculative_accept_threshold_single": {"speculative_algorithm": "EAGLE"},
    "speculative_accept_threshold_acc": {"speculative_algorithm": "EAGLE"},
    "offload_mode": {"offload_group_size": 2},
    "offload_group_size": {"offload_mode": "meta"},
    "enable_torch_compile": {"device": "cpu"},
}


def arguments(name: str, column: str) -> Tuple[SimpleNamespace, int]:
    """The `ServerArgs` fields (as vradix's launch checks read them) and the window of `name` combined with `column`,
    with the cell's own extra fields."""
    values = {name: ROW_VALUE.get(name, True), **ROW_NEEDS.get(name, {})}
    _, col_args, window = COLUMNS[column]
    values.update(col_args)
    values.update(cell(name, column).args)
    return SimpleNamespace(**values), window


# ---- the decisions ----------------------------------------------------------------------------------------------
# the six columns, for a field whose path does not touch what the column changes (the weights, a weight-derived
# copy, the rank layout): its own tests and the column's, never run together
def _independent(own: Tuple[str, ...], why: str) -> Dict[str, Cell]:
    return {
        "radix-off": ok(f"{why}; without a tree vradix still runs every publication (treeless)", own, F.RADIX_OFF[:1],
                        pair=False),
        "window": ok(f"{why}; a window keeps KV only, and is refused where it could not version it", own,
                     F.STALENESS[:1], pair=False),
        "ledger-off": ok(f"{why}; nothing of it reads the KV page ledger", own, F.NAMESPACE, pair=False),
        "streaming": ok(f"{why}; session slots are released at the publication like any stale KV", own,
                        F.SESSIONS[1:2], pair=False),
        "pd": ok(f"{why}; each role proves its own identity and the handshake compares them", own, F.PD[:1],
                 pair=False),
        "hicache": ok(f"{why}; host and L3 copies carry the namespace of the weights that computed them", own,
                      F.HICACHE[:1], pair=False),
    }


_WEIGHTS = "the identity is proven from what reaches `load_weights`"
_DERIVED = "weight-derived state is dropped or refused at every publication, whatever caches KV"
_RANKS = "every rank keeps its own tree and bumps once per publication"

_WINDOW_REFUSED = refused("a window is refused with this path (`staleness.check_server`)", F.WINDOW_REFUSED)
_WINDOW_LEDGER = refused("a window is refused where the ledger is off (`staleness.check_server`, "
                         "`staleness.check_ledger`)", F.WINDOW_LEDGER)
_WINDOW_SESSION = refused("a window is refused with streaming sessions (`staleness.check_server`)", F.WINDOW_SESSION)
_RADIX_OFF_SESSION = refused("the pair is refused at launch: without a tree vradix keeps no epochs, and the slot "
                             "would lend the last turn's KV across a publication", F.RADIX_OFF[1:])
_L3_SESSION = refused("SGLang's L3 prefetch stops the scheduler at a session's second turn, stock too (row "
                      "l3-streaming-session)", (F.REFUSED_AT_LAUNCH,), F.L3_SESSION)
_DECODE_SESSION = refused("streaming sessions on a decode role are refused (row pd-decode-session)",
                          (F.REFUSED_AT_LAUNCH,))
_DECODE_RADIX_OFF = refused("a decode role without its radix cache is refused (row pd-decode-radix-off)",
                            F.PD_RADIX_OFF)
_SGLANG_NO_HICACHE_WITHOUT_TREE = na("SGLang refuses --enable-hierarchical-cache with --disable-radix-cache")
_OWN_COLUMN = na("the column's own flag")


def _decode_only(hicache: Cell) -> Dict[str, Cell]:
    """A decode role's own field: refused without the decode radix cache, with a window and with streaming
    sessions; combined with another P/D role it is its own column."""
    return {"radix-off": _DECODE_RADIX_OFF, "window": _WINDOW_REFUSED,
            "ledger-off": ok("host-staged receiving turns decode's ledger off; the handshake still checks every "
                             "transfer, and a staged request holds nothing and is re-bound", F.PD_HOST_STAGED,
                             pair=False),
            "streaming": _DECODE_SESSION, "pd": na("a decode role's own field: the combination is its row"),
            "hicache": hicache}


_HYBRID = {
    "radix-off": ok("without a tree, recurrent state is per request; publications still run treeless", F.HYBRID,
                    F.RADIX_OFF[:1], pair=False),
    "window": refused("a window needs a full-attention tree it can age out (`staleness.check_cache`)",
                      F.WINDOW_HYBRID, by="engine start"),
    "ledger-off": ok("recurrent states are outside the KV ledger anyway; they hang off namespaced nodes", F.HYBRID,
                     pair=False),
    "streaming": ok("a slot's recurrent state is released with the slot (`release_session`)", F.HYBRID,
                    F.SESSIONS[1:2], pair=False),
    "pd": ok("recurrent state sent by prefill and restored by decode", (
        "test_e2e_pd_hybrid.py::test_a_hybrid_request_crossing_a_publication_on_both_roles_publishes_none_of_its_state",)),
    "hicache": ok("a restored prefix state lands in its node's slot", (
        "test_hybrid_hicache_cpu.py::test_a_restored_prefix_state_lands_in_its_node_slot_and_the_live_state_stays",)),
}
_LORA = {
    "radix-off": ok("adapter KV is never kept without a tree; unload frees the adapter's buffers", F.LORA,
                    F.RADIX_OFF[:1], pair=False),
    "window": _WINDOW_REFUSED,
    "ledger-off": ok("the adapter tag is in the namespace, not in the ledger", F.LORA, F.NAMESPACE, pair=False),
    "streaming": ok("a turn's adapter tag is part of its namespace; slots are released at a publication", F.LORA,
                    F.SESSIONS[1:2], pair=False),
    "pd": ok("the handshake compares the adapter's content identity", (
        "test_lora_identity.py::test_decode_refuses_kv_prefill_computed_with_an_adapter_content_decode_does_not_serve",)),
    "hicache": ok("L3 pages of a retrained adapter are never read", F.LORA_PATHS[:1]),
}
_HICACHE_MODE = {
    "radix-off": _SGLANG_NO_HICACHE_WITHOUT_TREE, "window": _WINDOW_REFUSED,
    "streaming": ok("host copies carry the namespace; session slots are released at a publication", F.HICACHE,
                    F.SESSIONS[1:2], pair=False),
    "hicache": na("a HiCache setting: the combination is its row"),
}

KV_ROWS: Dict[str, Dict[str, Cell]] = {
    "disable_radix_cache": {
        "radix-off": _OWN_COLUMN,
        "window": ok("treeless: the disabled tree matches nothing, so a bounded request reuses nothing",
                     F.WINDOW_RADIX_OFF),
        "ledger-off": ok("no KV is reused across requests, so there is nothing for the ledger to check", F.RADIX_OFF[:1],
                         pair=False),
        "streaming": _RADIX_OFF_SESSION,
        "pd": _DECODE_RADIX_OFF,
        "hicache": _SGLANG_NO_HICACHE_WITHOUT_TREE},
    "chunked_prefill_size": {
        "radix-off": ok("the chunk cache keeps one request's own chunks; nothing is shared", F.CHUNKED,
                        F.RADIX_OFF[:1], pair=False),
        "window": ok("a bounded request adopts its namespace before its first chunk and inserts there", F.CHUNKED,
                     F.STALENESS[:1], pair=False),
        "ledger-off": ok("the crossing mark, not the ledger, keeps a crossing request's chunks out of the tree",
                         F.CHUNKED, pair=False),
        "streaming": ok("a turn crossing a publication is a crossing request; its slot is released", F.CHUNKED,
                        F.SESSIONS[2:3], pair=False),
        "pd": ok("a prefill crossing a publication sends a mixed identity, which decode refuses", F.CHUNKED, F.PD[:1],
                 pair=False),
        "hicache": ok("a crossing request's mixed KV is never backed up", (
            "test_hicache_l2.py::test_a_crossing_requests_mixed_version_kv_is_never_backed_up",))},
    "page_size": _independent(F.FLAGS["page_size"].tests, "page-aligned matches and one ledger epoch per page"),
    "disable_overlap_schedule": _independent(F.OVERLAP, "the overlap queue is drained before an in_place pause"),
    "enable_session_radix_cache": {
        **_independent(F.NAMESPACE, "session pins hold nodes only; turns match in their namespace"),
        "radix-off": ok("a disabled tree has no node to pin", F.NAMESPACE, F.RADIX_OFF[:1], pair=False)},
    "enable_hierarchical_cache": {
        **_HICACHE_MODE,
        "ledger-off": ok("a host pool that cannot carry epochs turns the ledger off itself; copies still carry their "
                         "node's namespace and stale ones are freed at the bump", F.HICACHE, pair=False),
        "pd": ok("decode's HiCache restores only under the request's identity", (
            "test_e2e_pd_l3.py::test_after_a_publication_decode_never_restores_the_old_identitys_pages",))},
    "hicache_host_memory_mode": {
        **_HICACHE_MODE,
        "ledger-off": ok("buffer-only keeps the ledger off itself; its keys carry the namespace", F.BUFFER_ONLY),
        "pd": ok("storage keys carry the role's scope and namespace", F.BUFFER_ONLY, F.PD[:1], pair=False)},
    "hicache_storage_backend": {
        **_HICACHE_MODE,
        "streaming": _L3_SESSION,
        "ledger-off": ok("L3 keys carry the namespace; the landing guard compares epochs, not the ledger",
                         F.HICACHE_L3, pair=False),
        "pd": ok("decode restores only the request's identity's pages", (
            "test_e2e_pd_l3.py::test_after_a_publication_decode_never_restores_the_old_identitys_pages",))},
    "enable_unified_cache_external_linker": {
        "radix-off": na("SGLang refuses the external linker without a radix cache"),
        "window": _WINDOW_LEDGER,
        "ledger-off": na("the linker turns the ledger off itself: the combination is its row"),
        "streaming": ok("linker keys carry the namespace; session slots are released at a publication", F.LINKER,
                        F.SESSIONS[1:2], pair=False),
        "pd": ok("decode has no linker load-back (it only offloads, under namespaced keys)", F.LINKER, F.PD[:1],
                 pair=False),
        "hicache": na("SGLang refuses the external linker with HiCache")},
    "enable_lora": _LORA,
    "lora_paths": _LORA,
    "disaggregation_mode": {
        "radix-off": _DECODE_RADIX_OFF, "window": _WINDOW_REFUSED,
        "ledger-off": ok("host-staged receiving turns decode's ledger off; the handshake still checks every "
                         "transfer", F.PD_HOST_STAGED, F.PD[:1], pair=False),
        "streaming": _DECODE_SESSION, "pd": _OWN_COLUMN,
        "hicache": ok("decode's HiCache restores only under the request's identity", (
            "test_e2e_pd_l3.py::test_after_a_publication_decode_never_restores_the_old_identitys_pages",))},
    "disaggregation_decode_enable_radix_cache": _decode_only(
        ok("decode's HiCache restores only under the request's identity", (
            "test_e2e_pd_l3.py::test_after_a_publication_decode_never_restores_the_old_identitys_pages",))),
    "disaggregation_decode_enable_offload_kvcache": _decode_only(
        ok("offloaded pages are attributed to their identity; a crossing request offloads nothing", F.PD_OFFLOAD,
           pair=False)),
    "disaggregation_decode_retraction_backup": _decode_only(
        ok("a host-pool backup survives the publication and restores the request's own KV", F.PD_RETRACTION[1:])),
    "disaggregation_decode_host_receive_threshold": {
        **_decode_only(ok("a staged request holds nothing and is re-bound; HiCache copies carry the namespace",
                          F.PD_HOST_STAGED, F.HICACHE[:1], pair=False)),
        "ledger-off": na("host-staged receiving turns decode's ledger off itself: the combination is its row")},
    "enable_streaming_session": {
        "radix-off": _RADIX_OFF_SESSION, "window": _WINDOW_SESSION,
        "ledger-off": ok("slots are released by the publication's bookkeeping (`SessionSlots.settle_at_bump`), not by "
                         "the ledger", F.SESSIONS, pair=False),
        "streaming": _OWN_COLUMN, "pd": _DECODE_SESSION,
        "hicache": ok("the host tier alone (an L3 storage backend is refused, row l3-streaming-session): a slot's "
                      "record is released at a publication; host copies carry the namespace", F.SESSIONS,
                      F.HICACHE[:1], pair=False)},
    "speculative_algorithm": {
        "radix-off": ok("draft KV is per request without a tree", F.NAMESPACE, F.RADIX_OFF[:1], pair=False),
        "window": _WINDOW_LEDGER,
        "ledger-off": _OWN_COLUMN,
        "streaming": ok("draft KV shares the slots of the session's record, released with it", F.NAMESPACE,
                        F.SESSIONS[1:2], pair=False),
        "pd": ok("draft KV is the role's own; the handshake compares the target's identity", F.NAMESPACE, F.PD[:1],
                 pair=False),
        "hicache": ok("draft KV is in namespaced slots; host copies carry the namespace", F.NAMESPACE,
                      F.HICACHE[:1], pair=False)},
    "enable_multimodal": {
        **_independent(F.MM, _DERIVED),
        "radix-off": ok("the embedding cache is dropped at every publication without a tree too", (
            "test_e2e_multimodal.py::test_without_radix_cache_a_publication_recomputes_image_embeddings",))},
    "mamba_radix_cache_strategy": _HYBRID,
    "uses_mamba_radix_cache": _HYBRID,
}

#: refused fields whose refusal depends on the combination: their cells where the combination does not refuse
CONDITIONAL = {
    "enable_return_routed_experts": {
        "radix-off": ok("no prefix is loaded without a forward (the tree is disabled), so the capture reads slots "
                        "the request's own forwards wrote", F.RADIX_OFF[:1], pair=False,),
        "window": ok("a bounded request's prefix slots were written by forwards of the weights its response "
                     "reports", F.STALENESS[:1], pair=False),
        "ledger-off": refused("refused with the external linker (a loaded prefix's slots were never written by a "
                              "forward); with speculative decoding alone the capture reads forwards' slots",
                              (F.REFUSED_AT_LAUNCH,), enable_hierarchical_cache=False,
                              enable_unified_cache_external_linker=True),
        "streaming": ok("a lent record's slots were written by the session's own forwards", F.SESSIONS[1:2],
                        pair=False),
        "pd": refused("refused on a decode role (received KV was never written by a forward there)",
                      (F.REFUSED_AT_LAUNCH,), enable_hierarchical_cache=False),
        "hicache": refused("refused with HiCache (loaded-back KV was never written by a forward)",
                           (F.REFUSED_AT_LAUNCH,))},
}
CONDITIONAL["enable_return_indexer_topk"] = CONDITIONAL["enable_return_routed_experts"]

#: refused fields that are themselves a column's flag, or need what a column excludes
REFUSED_NA = {
    ("enable_pd_role_switch", "pd"): na("a role switch is a P/D role's own flag: the combination is its row"),
}


def _kind_cells(name: str) -> Dict[str, Cell]:
    entry = F.FLAGS[name]
    if name in KV_ROWS:
        return KV_ROWS[name]
    if name in F.IDENTITY_FIELDS:
        return _independent(entry.tests, _WEIGHTS)
    if name in F.RANK_FIELDS:
        return _independent(entry.tests, _RANKS)
    return _independent(entry.tests, _DERIVED)


#: the publication fuzzer's long profile (`vradix.testing.harness.fuzzer`), which runs these rows' paths together
#: with these columns on one server, every response checked against stock
FUZZER_LONG_PROFILE = "test_publication_fuzzer.py::test_publication_fuzzer_long_profile"
#: the cells its default draw (`fuzzer.LONG_PROFILE_*`) runs together (test_flag_matrix.py checks the draw)
FUZZED = frozenset({
    ("page_size", "radix-off"), ("page_size", "window"), ("page_size", "streaming"), ("page_size", "hicache"),
    ("chunked_prefill_size", "radix-off"), ("chunked_prefill_size", "window"), ("chunked_prefill_size", "streaming"),
    ("disable_overlap_schedule", "window"), ("disable_overlap_schedule", "streaming"),
    ("disable_overlap_schedule", "hicache"),
})


def cell(name: str, column: str) -> Cell:
    """The decided cell of field `name` with `column` (KeyError: the field is not a matrix row); a cell the fuzzer
    runs together is a pair test."""
    decided = _decided(name, column)
    if (name, column) in FUZZED and decided.decision == "supported":
        return replace(decided, text=f"{decided.text}; run together by the publication fuzzer",
                       tests=decided.tests + (FUZZER_LONG_PROFILE,), pair=True)
    return decided


def _decided(name: str, column: str) -> Cell:
    entry = F.FLAGS[name]
    if entry.class_ == "refused":
        if (name, column) in REFUSED_NA:
            return REFUSED_NA[(name, column)]
        conditional = CONDITIONAL.get(name, {})
        if column in conditional:
            return conditional[column]
        return refused("refused whatever it is combined with", entry.tests, by="its row")
    if entry.class_ != "versioned":
        raise KeyError(name)
    return _kind_cells(name)[column]


def rows(flags=None) -> list:
    """The matrix's rows: every `versioned` or `refused` field, sorted."""
    flags = F.FLAGS if flags is None else flags
    return sorted(n for n, e in flags.items() if e.class_ in ("versioned", "refused"))


def _render_cell(c: Cell) -> str:
    mark = {"supported": "✓", "refused at startup": "✗", "n/a": "–"}[c.decision]
    note = "" if c.pair or c.decision != "supported" else " †"
    return f"{mark}{note}"


def render(flags=None) -> str:
    """The markdown block docs/coverage.md embeds (`flag-matrix`): a grid of decisions, then every cell's reason
    and tests, per row."""
    names = rows(flags)
    cells = [(n, col, cell(n, col)) for n in names for col in COLUMNS]
    refused_cells = sum(1 for *_, c in cells if c.decision == "refused at startup")
    lines = [f"**Flag combinations** ({len(names)} rows × {len(COLUMNS)} columns = {len(cells)} cells: "
             f"{sum(1 for *_, c in cells if c.decision == 'supported')} supported, {refused_cells} refused at "
             f"startup, {sum(1 for *_, c in cells if c.decision == 'n/a')} n/a). ✓ supported, ✗ refused at startup, "
             "– n/a; † each path is tested alone and the reason says why they do not interact.", "",
             "Columns: " + "; ".join(f"**{col}**: {title}" for col, (title, _a, _w) in COLUMNS.items()), "",
             "| field | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for n in names:
        lines.append(f"| `{n}` | " + " | ".join(_render_cell(cell(n, col)) for col in COLUMNS) + " |")
    lines += ["", "<details><summary>Every cell's reason and tests</summary>", "",
              "| field | column | decision | why | tests |", "|---|---|---|---|---|"]
    for n, col, c in cells:
        tests = ", ".join(f"`{t}`" for t in c.tests) or "—"
        by = f" ({c.by})" if c.by else ""
        lines.append(f"| `{n}` | {col} | {c.decision}{by} | {c.text.replace('|', '/')} | {tests} |")
    lines += ["", "</details>"]
    return "\n".join(lines)
