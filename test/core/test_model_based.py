"""Model-based randomized test of the versioned radix cache (hypothesis `RuleBasedStateMachine`).

The system under test is SGLang's real `UnifiedRadixCache` (Rust and Python TreeCores, page sizes 1 and 16) with its
real allocator and `ReqToTokenPool`, driven through the scheduler's own `mem_cache.common` functions with the vradix
hooks installed (conftest's `load_plugins()`). Publications call the real `vradix.scheduler.publication.bump_scheduler`
and flushes the real `vradix.hooks.publication.lock_aware_flush` (around SGLang's stock reset), through a
`SchedulerView` over the fixture; forward writes are stamped by the real `Scheduler.run_batch` hook.

The reference model is a map `slot -> (epoch that computed it, user key, hash of the token prefix it encodes)`,
written whenever a request computes KV. Invariants checked after every rule:
- a match only ever returns slots computed under the request's (= the engine's current) epoch, for the same user key
  and the same token prefix (so: no stale KV, no foreign namespace, no wrong tokens);
- allocator accounting: available + evictable + protected + request-owned == total;
- no slot is free twice, and no slot is both free and owned (by the tree or by a request row);
- every tree slot of an older epoch is on the locked path of a live crossing request, or awaits the deferred reclaim
  (`vradix.core.deferred_reclaim`), which the rules drive per scheduler iteration (`reclaim_slice`), on demand
  (`allocate_under_pressure`: stale KV is evicted before any fresh KV), at idle (`idle_finishes_reclaim`), and which
  a publication may interrupt (`publish_mid_reclaim`);
- crossing bookkeeping matches the model, and after releasing everything and publishing, the pool is full.

Profiles (env `VRADIX_MBT_PROFILE`): `ci` (default; derandomized, a few hundred examples over the 4 configurations,
about a minute on 2 cores) and `long` (>= 100k rule executions in total, random). `VRADIX_MBT_EXAMPLES` overrides
the examples per configuration. The executed-rule counts are printed at the end of the module (run with `-s`).
"""
from __future__ import annotations

import os
from array import array
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache import common

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from vradix import identity, request
from vradix.core import deferred_reclaim, staleness
from vradix.scheduler.publication import bump_scheduler
from vradix.hooks.publication import lock_aware_flush
from vradix.hooks.reclaim import finish_reclaim_when_idle, reclaim_slice
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.hicache_fixture import build_hicache, versioned

CONFIGS = [("rust", 1), ("rust", 16), ("python", 1), ("python", 16)]
#: SGLang's eviction policy per configuration (default LRU): under LFU the stale KV need not come first in SGLang's
#: eviction order, which the deferred reclaim must not rely on
EVICTION_POLICY = {("rust", 16): "lfu", ("python", 1): "lfu"}
#: HiCache host tier: each core and page size once, each write policy twice
HICACHE_CONFIGS = [("rust", 1, "write_through"), ("rust", 16, "write_back"), ("python", 1, "write_back"),
                   ("python", 16, "write_through")]
PROFILES = {  # examples per configuration, steps per example
    "ci": dict(max_examples=120, stateful_step_count=50, derandomize=True),
    "long": dict(max_examples=3000, stateful_step_count=100, derandomize=False),
}
PROFILE = os.environ.get("VRADIX_MBT_PROFILE", "ci")
#: the HiCache configurations' share of the profile (their steps cost more)
HICACHE_PROFILE = {"ci": dict(max_examples=60), "long": {}}[PROFILE]
#: staleness windows: each core and page size once, windows 1 and 2 twice each
WINDOW_CONFIGS = [("rust", 1, 1), ("rust", 16, 2), ("python", 1, 2), ("python", 16, 1)]
#: the windowed configurations' share of the profile
WINDOW_PROFILE = {"ci": dict(max_examples=30), "long": {}}[PROFILE]
RULES_RUN: Counter = Counter()

#: a small vocabulary of shared prefixes so that prompts collide (paged: multiples of and across page boundaries)
PREFIXES = [[], [5] * 16, [5] * 16 + [6] * 16, [7, 8] * 12, [5] * 16 + [6] * 8 + [9] * 17]
USER_KEYS = [None, None, "tenantA", "tenantB"]
MAX_PROMPT = 64


def prefix_hash(tokens, n):
    return hash(tuple(tokens[:n]))


class VersionedCacheMachine(RuleBasedStateMachine):
    core, page_size, eviction_policy = "rust", 1, "lru"

    def __init__(self):
        super().__init__()
        self.fx = self.build_fixture(kv_tokens=256 if self.page_size == 1 else 512)
        self.state = self.start_vradix()
        self.queued = []  # stamped, hold no KV
        self.held = []  # hold a row and a tree lock
        self.paused = False
        self.slot_meta = {}  # slot -> (epoch, user key, prefix hash): what the KV in the slot was computed from
        self.crossed = set()  # rids the model says hold KV across a bump

    def build_fixture(self, kv_tokens):
        return build_cache(self.core, self.page_size, kv_tokens=kv_tokens, max_reqs=6, max_context_len=256,
                           eviction_policy=self.eviction_policy)

    def start_vradix(self):
        return attach(self.fx.cache)

    # ---- helpers --------------------------------------------------------------------------------------------------
    def meta_at(self, slot):
        """(epoch, user key, prefix hash[, namespace epoch]) of the KV in device slot `slot`: what computed it, and
        the namespace of the request that computed it."""
        return self.slot_meta.get(slot)

    def count(self, name):
        RULES_RUN[name] += 1

    def row(self, req, end):
        return self.fx.req_pool.req_to_token[req.kv.req_pool_idx, :end].tolist()

    def pick(self, reqs, i):
        return reqs[i % len(reqs)]

    def tokens(self, req):
        return list(req.origin_input_ids) + list(req.output_ids)

    def can_allocate(self, start, end):
        ps = self.page_size
        need = (-(-end // ps) - (-(-start // ps))) * ps
        if need > self.fx.allocator.available_size():
            common.evict_from_tree_cache(self.fx.cache, need)  # the scheduler's eviction under pressure
        return need <= self.fx.allocator.available_size()

    def compute(self, req, upto, *, decode_token=None):
        """Allocate + 'compute' KV for [extend_end, upto) and record what each new slot now holds."""
        start = req.extend_end
        if decode_token is not None:
            self.fx.decode(req, decode_token)
        else:
            self.fx.prefill(req, upto=upto)
        toks = self.tokens(req)
        key = request.of(req).user_key
        ns = request.of(req).epoch
        for pos, slot in enumerate(self.row(req, req.extend_end)[start:], start):
            self.slot_meta[slot] = (self.state.epoch, key, prefix_hash(toks, pos + 1), ns)

    def release(self, req):
        self.held.remove(req)
        self.crossed.discard(req.rid)

    def scheduler(self):
        # the bump walks the waiting queue; sometimes leave requests out to exercise the lazy re-bind at match
        return self.fx.scheduler_view(waiting=self.queued[::2] if self.state.epoch % 2 else self.queued,
                                      running=self.held, paused=self.paused)

    def bump(self):
        bump_scheduler(self.scheduler(), reason="mbt", label=f"v{self.state.epoch + 1}")
        self.crossed.update(r.rid for r in self.held)

    def stock_flush(self, _scheduler, *args, **kwargs):
        """SGLang's own flush_cache when idle: reset the tree and clear the pools."""
        self.fx.cache.reset()
        self.fx.req_pool.clear()
        self.fx.allocator.clear()
        return True

    # ---- rules ----------------------------------------------------------------------------------------------------
    @precondition(lambda self: len(self.queued) + len(self.held) < 12)
    @rule(p=st.integers(0, len(PREFIXES) - 1), suffix=st.lists(st.integers(1, 3), min_size=1, max_size=24),
          k=st.integers(0, len(USER_KEYS) - 1))
    def new_request(self, p, suffix, k):
        req = self.fx.make_req((PREFIXES[p] + suffix)[:MAX_PROMPT], extra_key=USER_KEYS[k])
        self.state.admit_or_raise(req)
        self.queued.append(req)
        self.count("new_request")

    @precondition(lambda self: self.queued and not self.paused)
    @rule(i=st.integers(0, 100), n=st.integers(1, 40))
    def admit_match_lock_prefill(self, i, n):
        """PrefillAdder + prepare_for_extend: match, lock, take a row and compute the first chunk of n tokens."""
        if self.admit_one(self.pick(self.queued, i), n):
            self.count("admit_match_lock_prefill")

    def admit_one(self, req, n) -> bool:
        """Admit queued `req` and compute up to n tokens of it; False when no row or pool space is left."""
        ps = self.page_size
        if self.fx.req_pool.available_size() == 0 or not self.can_allocate(0, -(-n // ps) * ps):
            return False
        self.fx.admit(req)
        self.queued.remove(req)
        self.held.append(req)
        self.check_match(req)
        upto = min(len(req.origin_input_ids), req.prefix_len + n)
        if self.can_allocate(req.extend_end, upto):  # a HiCache load-back may have taken the space
            self.compute(req, upto)
        return True

    def check_match(self, req):
        """The match just made returned only slots of the current epoch, user key and token prefix."""
        assert self.state.epoch_of(req.extra_key) == self.state.epoch, "admitted under an old epoch"
        toks, key = self.tokens(req), request.of(req).user_key
        for pos, slot in enumerate(self.row(req, req.prefix_len)):
            got = self.meta_at(slot)
            assert got[:3] == (self.state.epoch, key, prefix_hash(toks, pos + 1)), (
                f"match returned slot {slot} at position {pos} holding {got}, expected epoch {self.state.epoch}")

    @precondition(lambda self: any(r.extend_end < len(r.origin_input_ids) for r in self.held) and not self.paused)
    @rule(i=st.integers(0, 100), n=st.integers(1, 40))
    def prefill_chunk_and_checkpoint(self, i, n):
        req = self.pick([r for r in self.held if r.extend_end < len(r.origin_input_ids)], i)
        upto = min(len(req.origin_input_ids), req.extend_end + n)
        if self.can_allocate(req.extend_end, upto):
            self.compute(req, upto)
        self.count("prefill_chunk_and_checkpoint")

    @precondition(lambda self: any(r.extend_end >= len(r.origin_input_ids) for r in self.held) and not self.paused)
    @rule(i=st.integers(0, 100), tok=st.integers(1, 3))
    def decode(self, i, tok):
        req = self.pick([r for r in self.held if r.extend_end >= len(r.origin_input_ids)], i)
        if req.extend_end < 200 and self.can_allocate(req.extend_end, req.extend_end + 1):
            self.compute(req, None, decode_token=tok)
        self.count("decode")

    @precondition(lambda self: any(r.extend_end >= len(r.origin_input_ids) for r in self.held) and not self.paused)
    @rule(i=st.integers(0, 100))
    def finish_release_insert(self, i):
        req = self.pick([r for r in self.held if r.extend_end >= len(r.origin_input_ids)], i)
        self.fx.finish(req)
        self.release(req)
        self.count("finish_release_insert")

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100), running=st.booleans())
    def abort(self, i, running):
        """Abort a request holding KV (also while paused in_place): a running one is released like a finished one
        (checkpoint=True), a chunked one without checkpoint, as the scheduler does."""
        req = self.pick(self.held, i)
        req.finished_reason = FINISH_ABORT("Aborted")
        common.release_kv_cache(req, self.fx.cache, checkpoint=running)
        self.release(req)
        self.count("abort")

    @precondition(lambda self: self.queued)
    @rule(i=st.integers(0, 100), rare=st.integers(1, 5))
    def abort_queued(self, i, rare):
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        self.queued.remove(self.pick(self.queued, i))
        self.count("abort_queued")

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def retract(self, i):
        req = self.pick(self.held, i)
        self.fx.retract(req)
        self.release(req)
        self.queued.append(req)
        assert id(req) not in self.state.crossing and not request.of(req).crossed
        self.count("retract")

    @precondition(lambda self: not self.paused)
    @rule(rare=st.integers(1, 5))
    def pause_in_place(self, rare):
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        self.paused = True
        self.count("pause_in_place")

    @precondition(lambda self: not self.paused)
    @rule(rare=st.integers(1, 5))
    def pause_retract(self, rare):
        """pause_generation(mode="retract"): every request holding KV is retracted and re-queued."""
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        for req in list(self.held):
            self.fx.retract(req)
            self.release(req)
            self.queued.append(req)
        self.paused = True
        self.count("pause_retract")

    @precondition(lambda self: self.paused)
    @rule()
    def continue_generation(self):
        self.paused = False
        self.count("continue_generation")

    @rule(rare=st.integers(1, 3))
    def publish(self, rare):
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        self.bump()
        self.count("publish")

    @precondition(lambda self: not self.paused and len(self.queued) + len(self.held) < 10)
    @rule(p=st.integers(0, len(PREFIXES) - 1), k=st.integers(0, len(USER_KEYS) - 1),
          first=st.lists(st.integers(1, 3), min_size=1, max_size=8),
          second=st.lists(st.integers(1, 3), min_size=1, max_size=8))
    def publish_over_cached_kv(self, p, k, first, second):
        """A request runs to its end (its KV is cached, unlocked), another holds its KV across a publication, and
        after it a third caches fresh KV on the same prefix, next to the stale KV awaiting the deferred reclaim."""
        def run(tokens, to_end):
            req = self.fx.make_req((PREFIXES[p] + tokens)[:MAX_PROMPT], extra_key=USER_KEYS[k])
            self.state.admit_or_raise(req)
            self.queued.append(req)
            if not self.admit_one(req, MAX_PROMPT) or req.extend_end < len(req.origin_input_ids):
                return False
            if to_end:
                self.fx.finish(req)
                self.release(req)
            return True

        if run(first, True) and run(second, False):
            self.bump()
            run(first, True)
            self.count("publish_over_cached_kv")

    @precondition(lambda self: self.state.deferred.active)
    @rule()
    def reclaim_slice(self):
        """One scheduler iteration's slice of the deferred reclaim (the hook before `get_next_batch_to_run`)."""
        q = self.state.deferred
        before = q.pending_tokens
        fresh = self.fresh_tree_slots()
        reclaim_slice(self.scheduler())
        assert q.max_slice_visits <= deferred_reclaim.SLICE_VISITS and q.max_slice_nodes <= deferred_reclaim.SLICE_NODES
        assert q.pending_tokens <= before
        assert fresh <= set(self.fx.cache.tree_core.all_values_flatten().tolist()), "a slice evicted fresh KV"
        self.count("reclaim_slice")

    @precondition(lambda self: self.state.deferred.active and self.state.deferred.pending_tokens > 0)
    @rule(n=st.integers(1, 64))
    def allocate_under_pressure(self, n):
        """An allocation that needs memory while stale KV awaits its reclaim: the stale KV goes first (the scheduler's
        `evict_from_tree_cache`), and fresh KV is evicted only for what the stale KV could not cover."""
        q = self.state.deferred
        shortfall = min(n, q.pending_tokens)  # the stale KV can cover it
        fresh = self.fresh_tree_slots()
        want = self.fx.allocator.available_size() + shortfall
        common.evict_from_tree_cache(self.fx.cache, want)
        assert self.fx.allocator.available_size() >= want
        assert fresh <= set(self.fx.cache.tree_core.all_values_flatten().tolist()), (
            "fresh KV evicted while stale KV could cover the allocation")
        self.count("allocate_under_pressure")

    @precondition(lambda self: self.state.deferred.active)
    @rule()
    def publish_mid_reclaim(self):
        """A second publication while the previous epoch's stale KV is only partly reclaimed."""
        reclaim_slice(self.scheduler())
        self.bump()
        self.count("publish_mid_reclaim")

    @precondition(lambda self: self.state.deferred.active and not self.held)
    @rule()
    def idle_finishes_reclaim(self):
        """A fully idle engine finishes the deferred reclaim before SGLang's idle check (the hook before `on_idle`)."""
        view = self.fx.scheduler_view(running=self.held)
        finish_reclaim_when_idle(view)
        assert not self.state.deferred.active and self.state.deferred.pending_tokens == 0
        self.check_no_stale_unpinned()
        self.count("idle_finishes_reclaim")

    @rule(n=st.integers(1, 128), rare=st.integers(1, 3))
    def evict_under_pressure(self, n, rare):
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        common.evict_from_tree_cache(self.fx.cache, self.fx.allocator.available_size() + n)
        self.count("evict_under_pressure")

    @rule(rare=st.integers(1, 5))
    def flush(self, rare):
        """Scheduler.flush_cache with vradix: the stock reset when fully idle, else a lock-aware bump."""
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        flushes = self.state.flushes
        assert lock_aware_flush(self.stock_flush, self.scheduler())
        assert self.state.flushes == flushes + 1
        if self.held:
            self.crossed.update(r.rid for r in self.held)
        self.count("flush")

    @rule(rare=st.integers(1, 5))
    def release_all_and_check_pool_full(self, rare):
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        self.release_all()
        self.count("release_all_and_check_pool_full")

    def release_all(self):
        for req in list(self.held):
            self.fx.finish(req)
            self.release(req)
        self.paused = False
        assert not self.state.crossing
        self.bump()
        fx = self.fx
        assert fx.cache.evictable_size() == 0 and fx.cache.protected_size() == 0
        assert fx.allocator.available_size() == fx.total, fx.accounting()
        assert fx.req_pool.available_size() == fx.req_pool.size

    # ---- invariants -----------------------------------------------------------------------------------------------
    @invariant()
    def audit_finds_no_leak(self):
        assert self.state.guard.stats.leaked_pages_total == 0, "the post-publication audit found a leaked page"

    @invariant()
    def accounting_balances(self):
        assert self.fx.busy_invariant_holds(self.held), (self.fx.accounting(), self.fx.total)

    @invariant()
    def no_slot_free_and_owned(self):
        free = free_slots(self.fx)
        assert len(free) == len(set(free)), "a slot is free twice"
        free = set(free)
        tree = set(self.fx.cache.tree_core.all_values_flatten().tolist())
        assert not tree & free, "a tree slot is free"
        for r in self.held:
            assert not set(self.row(r, r.kv.kv_committed_len)) & free, f"{r.rid} owns a free slot"

    def fresh_tree_slots(self):
        return {s for s in self.fx.cache.tree_core.all_values_flatten().tolist()
                if self.meta_at(s)[0] == self.state.epoch}

    @invariant()
    def stale_slots_are_pinned_by_crossing_requests(self):
        if not self.state.deferred.active:  # else unlocked stale KV awaits the deferred reclaim
            self.check_no_stale_unpinned()

    def check_no_stale_unpinned(self):
        cache = self.fx.cache
        pinned = self.locked_slots(self.state.crossing.values())
        for slot in cache.tree_core.all_values_flatten().tolist():
            epoch = self.kept_epoch(self.meta_at(slot))
            assert epoch >= self.oldest_kept() or slot in pinned, (
                f"tree slot {slot} of epoch {epoch} (current {self.state.epoch}) is neither kept nor pinned")

    def kept_epoch(self, meta):
        """The epoch that decides whether a tree slot may stay: the epoch that computed it (no window)."""
        return meta[0]

    def oldest_kept(self):
        return self.state.epoch

    def locked_slots(self, reqs):
        """Tree slots on the locked paths of `reqs`."""
        cache = self.fx.cache
        out = set()
        for r in reqs:
            if getattr(r, "lock", None) is not None and not cache.is_root(r.lock.node):
                out.update(cache.tree_core.collect_full_device_indices(r.lock.node, cache.root_node_handle()).tolist())
        return out

    @invariant()
    def crossing_bookkeeping_matches_model(self):
        held = {r.rid for r in self.held}
        assert {r.rid for r in self.state.crossing.values()} <= held & self.crossed
        for r in self.held:
            if r.rid in self.crossed:
                assert r.skip_radix_cache_insert, f"crossing {r.rid} may insert"

    def teardown(self):
        if getattr(self, "fx", None) is not None:
            self.release_all()


class WindowedCacheMachine(VersionedCacheMachine):
    """The same machine with a staleness window (`vradix.core.staleness`): the server keeps the namespaces of the
    last `window` epochs, and bounded requests (bound 0 .. window) adopt the window namespace with the longest match.
    The model records, per slot, the namespace epoch of the request that computed it. Extra rules: bounded admissions,
    window expiry across publications, eviction under pressure (older in-window KV before current-epoch KV).
    Invariants (besides the base ones):
    - a bounded request's match returns only slots of its adopted namespace (within its bound, never older than the
      window), computed at epochs from that namespace's to the current one, for the same token prefix and user key;
    - an exact request's match returns only slots computed under the current epoch by requests whose namespace was the
      current one (never KV computed on top of stale KV);
    - every tree slot of a namespace older than the window is pinned by a crossing request or awaits the deferred
      reclaim, and after releasing everything and `window + 1` publications the pool is full."""
    window = 1

    def start_vradix(self):
        state = attach(self.fx.cache)
        state.staleness.window = self.window
        return state

    def kept_epoch(self, meta):
        return meta[3]

    def oldest_kept(self):
        return self.state.window_floor

    def check_match(self, req):
        st_ = request.of(req)
        epoch, toks = self.state.epoch, self.tokens(req)
        bound = self.bound_asked(req)
        ns = st_.epoch
        assert st_.max_staleness == bound, f"bound {st_.max_staleness} bound, {bound} asked"
        assert self.state.epoch_of(req.extra_key) == ns, "matched outside the adopted namespace"
        assert max(epoch - bound, self.oldest_kept()) <= ns <= epoch, (
            f"adopted namespace {ns} outside bound {bound} at epoch {epoch}")
        lo = ns if bound else epoch
        if ns < epoch and req.prefix_len:
            self.count("matched_older_namespace")
        for pos, slot in enumerate(self.row(req, req.prefix_len)):
            got = self.meta_at(slot)
            assert got[1:] == (st_.user_key, prefix_hash(toks, pos + 1), ns) and lo <= got[0] <= epoch, (
                f"bound {bound}: match returned slot {slot} at position {pos} holding {got}, "
                f"namespace {ns}, epoch {epoch}")

    def bound_asked(self, req):
        """The bound the model asked for: the request's own `custom_params` value, else the server window."""
        params = req.sampling_params.custom_params or {}
        return params.get(staleness.PARAM, self.window)

    @precondition(lambda self: len(self.queued) + len(self.held) < 12)
    @rule(p=st.integers(0, len(PREFIXES) - 1), suffix=st.lists(st.integers(1, 3), min_size=1, max_size=24),
          k=st.integers(0, len(USER_KEYS) - 1), bound=st.integers(0, 2))
    def new_request_with_bound(self, p, suffix, k, bound):
        """A request naming its bound (0: exact); `new_request` names none, so it gets the server window."""
        req = self.fx.make_req((PREFIXES[p] + suffix)[:MAX_PROMPT], extra_key=USER_KEYS[k])
        req.sampling_params.custom_params = {staleness.PARAM: min(bound, self.window)}
        self.state.admit_or_raise(req)
        self.queued.append(req)
        self.count("new_request_with_bound")

    def older_unlocked_slots(self):
        """Tree slots computed in an older (in-window) namespace that no held request locks."""
        older = {s for s in self.tree_slots() if self.meta_at(s)[3] < self.state.epoch}
        return older - self.locked_slots(self.held)

    @precondition(lambda self: self.state.epoch > 0 and self.older_unlocked_slots())
    @rule(n=st.integers(1, 64))
    def allocate_under_pressure(self, n):
        """An allocation that needs memory: KV older than the window, then in-window KV of older namespaces, go
        before any current-epoch KV; current-epoch KV is evicted only once every older slot left is locked."""
        cur = lambda: {s for s in self.tree_slots() if self.meta_at(s)[3] == self.state.epoch}
        current = cur()
        want = self.fx.allocator.available_size() + n
        evicted_in_window = self.state.staleness.tokens_evicted_in_window
        common.evict_from_tree_cache(self.fx.cache, want)
        if self.state.staleness.tokens_evicted_in_window > evicted_in_window:
            self.count("evicted_older_in_window")
        if not current <= cur():
            older = {s for s in self.tree_slots() if self.meta_at(s)[3] < self.state.epoch}
            assert older <= self.locked_slots(self.held), "current-epoch KV evicted while older unlocked KV was left"
        self.count("allocate_under_pressure")

    @rule(rare=st.integers(1, 3))
    def window_expiry(self, rare):
        """`window + 1` publications: every namespace that held KV before them ages out; the deferred reclaim (one
        slice per scheduler iteration) frees all of it that no crossing request pins, and it is never matched again
        (the match invariants)."""
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        before = self.state.epoch
        for _ in range(self.window + 1):
            self.bump()
        assert self.state.window_floor > before
        for _ in range(10_000):
            if not self.state.deferred.active:
                break
            reclaim_slice(self.scheduler())
        assert not self.state.deferred.active
        self.check_no_stale_unpinned()
        self.count("window_expiry")

    def tree_slots(self):
        return set(self.fx.cache.tree_core.all_values_flatten().tolist())

    def release_all(self):
        """Release everything, then `window + 1` publications and the idle reclaim: the pool is full."""
        for req in list(self.held):
            self.fx.finish(req)
            self.release(req)
        self.paused = False
        for _ in range(self.window + 1):
            self.bump()
        finish_reclaim_when_idle(self.fx.scheduler_view())
        fx = self.fx
        assert fx.cache.evictable_size() == 0 and fx.cache.protected_size() == 0, fx.accounting()
        assert fx.allocator.available_size() == fx.total, fx.accounting()
        assert fx.req_pool.available_size() == fx.req_pool.size


class HiCacheMachine(VersionedCacheMachine):
    """The same machine over a cache with a HiCache host tier (L2, SGLang's real host pool and controller; host pool
    as large as the device pool, so it is under pressure). Admission loads host hits back, write-through backs every
    insert up (write-back: device eviction does), device eviction demotes backed-up nodes, and the rules below add the
    host tier's own steps. The model reads KV provenance from the KV itself: every computed slot carries a code of
    (epoch, user key, prefix hash), which real backups and load-backs copy. Extra invariants: no host page ever holds
    KV of an older epoch, SGLang's tree sanity check, and after everything is released the host pool is whole again."""
    write_policy = "write_through"

    def build_fixture(self, kv_tokens):
        self.metas = []
        fx = build_hicache(self.core, self.page_size, kv_tokens=kv_tokens, write_policy=self.write_policy,
                           host_ratio=1.0, max_reqs=6, max_context_len=256)
        fx.kv_code = self.code_for
        load_host_hit = fx.load_host_hit

        def counted_load_host_hit(req):
            before = req.prefix_len
            load_host_hit(req)
            if req.prefix_len > before:
                self.count("load_back")

        fx.load_host_hit = counted_load_host_hit
        return fx

    def start_vradix(self):
        return versioned(self.fx)  # with the KV page ledger and the host ledger, as a HiCache engine starts

    def code_for(self, req, pos):
        self.metas.append((self.state.epoch, request.of(req).user_key, prefix_hash(self.tokens(req), pos + 1)))
        return len(self.metas)

    def meta_at(self, slot):
        code = self.fx.device_codes([slot])[0]
        return self.metas[code - 1] if 0 < code <= len(self.metas) else None

    def acks_pending(self):
        cc = self.fx.cache.cache_controller
        return bool(cc.write_queue or cc.ack_write_queue or cc.ack_load_queue)

    @precondition(acks_pending)
    @rule(rare=st.integers(1, 3))
    def poll_hicache_acks(self, rare):
        """The scheduler's per-step `check_hicache_events`: backup and load-back acks. Other rules run in between, so
        publications, releases and evictions meet transfers in flight."""
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        self.fx.process_acks()
        self.count("poll_hicache_acks")

    @precondition(lambda self: len(self.held) < 4 and not self.paused)
    @rule(p=st.integers(1, len(PREFIXES) - 1), k=st.integers(0, len(USER_KEYS) - 1),
          first=st.lists(st.integers(1, 3), min_size=1, max_size=8),
          second=st.lists(st.integers(1, 3), min_size=1, max_size=8), n=st.integers(1, 40))
    def reuse_a_prefix_through_host(self, p, k, first, second, n):
        """A request runs to its end on a shared prefix (write-through backs its insert up), the scheduler takes the
        acks, device pressure demotes the prefix to host (write-back backs it up there), and a second request on the
        prefix is admitted: it loads the prefix back (the copy starts; its ack is left to the next poll)."""
        a = self.fx.make_req((PREFIXES[p] + first)[:MAX_PROMPT], extra_key=USER_KEYS[k])
        self.state.admit_or_raise(a)
        self.queued.append(a)
        if not self.admit_one(a, MAX_PROMPT) or a.extend_end < len(a.origin_input_ids):
            return
        self.fx.finish(a)
        self.release(a)
        self.fx.process_acks()
        common.evict_from_tree_cache(self.fx.cache, self.fx.total)
        b = self.fx.make_req((PREFIXES[p] + second)[:MAX_PROMPT], extra_key=USER_KEYS[k])
        self.state.admit_or_raise(b)
        self.queued.append(b)
        self.admit_one(b, n)
        self.count("reuse_a_prefix_through_host")

    @rule(p=st.integers(0, len(PREFIXES) - 1), k=st.integers(0, len(USER_KEYS) - 1))
    def backup_prefix(self, p, k):
        """Back a cached prefix of the current epoch up to host, parent first (SGLang's backup chain)."""
        cache = self.fx.cache
        prefix = self.state.prefix_of_epoch(self.state.epoch)
        key = RadixKey(array("q", PREFIXES[p]), extra_key=identity.stamped(prefix, USER_KEYS[k]))
        node = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
        if not cache.is_root(node):  # the call an insert's write-through makes (its backup locks the node until the ack)
            cache._execute_and_commit_kv_backup(cache.tree_core.build_backup_kv_action(node))
        self.count("backup_prefix")

    @rule(n=st.integers(1, 256), rare=st.integers(1, 3))
    def evict_host_under_pressure(self, n, rare):
        if rare != 2:  # hypothesis favours boundary values; act on a middle one to keep this rule rare
            return
        self.fx.cache.evict_host(n)
        self.count("evict_host_under_pressure")

    @invariant()
    def host_holds_no_stale_kv(self):
        for host_slot, code in self.fx.host_codes().items():
            meta = self.metas[code - 1] if 0 < code <= len(self.metas) else None
            assert meta is not None and meta[0] == self.state.epoch, (
                f"host slot {host_slot} holds {meta} (current epoch {self.state.epoch})")

    @invariant()
    def tree_is_sane(self):
        # the Rust TreeCore's check reports a load-back whose ack is pending ("Full host coexistence missing")
        if not self.fx.cache.ongoing_load_back:
            self.fx.cache.sanity_check()

    def release_all(self):
        super().release_all()
        assert self.fx.host_idle_leaks() == [], self.fx.host_figures()


def free_slots(fx):
    pages = fx.allocator.free_pages.tolist()
    if fx.page_size == 1:
        return pages
    return [p * fx.page_size + i for p in pages for i in range(fx.page_size)]


def windowed_machine_for(core, page_size, window):
    return type(f"Windowed{window}_{core}_ps{page_size}", (WindowedCacheMachine,),
                {"core": core, "page_size": page_size, "window": window,
                 "eviction_policy": EVICTION_POLICY.get((core, page_size), "lru")})


def machine_for(core, page_size, write_policy=None):
    if write_policy is None:
        return type(f"VersionedCache_{core}_ps{page_size}", (VersionedCacheMachine,),
                    {"core": core, "page_size": page_size,
                     "eviction_policy": EVICTION_POLICY.get((core, page_size), "lru")})
    return type(f"HiCache_{core}_ps{page_size}_{write_policy}", (HiCacheMachine,),
                {"core": core, "page_size": page_size, "write_policy": write_policy})


def profile_settings(**overrides):
    cfg = dict(PROFILES[PROFILE], **overrides)
    if os.environ.get("VRADIX_MBT_EXAMPLES"):
        cfg["max_examples"] = int(os.environ["VRADIX_MBT_EXAMPLES"])
    return settings(deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    **cfg)


@pytest.fixture(scope="module", autouse=True)
def report_rule_counts():
    yield
    print(f"\n[mbt] profile={PROFILE} rule executions: {sum(RULES_RUN.values())} "
          + " ".join(f"{k}={v}" for k, v in sorted(RULES_RUN.items())))


@pytest.mark.timeout(3600 * 6)
@pytest.mark.parametrize("core,page_size", CONFIGS, ids=[f"{c}-ps{p}" for c, p in CONFIGS])
def test_versioned_cache_state_machine(core, page_size, monkeypatch):
    # small slices, so that the deferred reclaim of these small trees spans several scheduler iterations
    monkeypatch.setattr(deferred_reclaim, "SLICE_NODES", 2)
    monkeypatch.setattr(deferred_reclaim, "SLICE_VISITS", 4)
    run_state_machine_as_test(machine_for(core, page_size), settings=profile_settings())


@pytest.mark.timeout(3600 * 6)
@pytest.mark.parametrize("core,page_size,policy", HICACHE_CONFIGS, ids=[f"{c}-ps{p}-{w}" for c, p, w in HICACHE_CONFIGS])
def test_hicache_state_machine(core, page_size, policy):
    run_state_machine_as_test(machine_for(core, page_size, policy), settings=profile_settings(**HICACHE_PROFILE))


@pytest.mark.timeout(3600 * 6)
@pytest.mark.parametrize("core,page_size,window", WINDOW_CONFIGS, ids=[f"{c}-ps{p}-k{w}" for c, p, w in WINDOW_CONFIGS])
def test_windowed_cache_state_machine(core, page_size, window, monkeypatch):
    monkeypatch.setattr(deferred_reclaim, "SLICE_NODES", 2)
    monkeypatch.setattr(deferred_reclaim, "SLICE_VISITS", 4)
    run_state_machine_as_test(windowed_machine_for(core, page_size, window), settings=profile_settings(**WINDOW_PROFILE))
