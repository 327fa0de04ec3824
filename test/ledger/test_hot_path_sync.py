"""No device synchronisation added to a scheduler iteration, on SGLang's real UnifiedRadixCache (both tree cores, page
sizes 1 and 16).

The KV page ledger's tensor is replaced by a counting stand-in (`Counted`: the same memory, as a tensor subclass that
records every host read of it or of anything computed from it: `.item()`, `.tolist()`, `.cpu()`, `.numpy()`,
`bool()`, `int()`, `float()`), and every device or event synchronise call is counted too. The kernels run their
device forms (`VRADIX_KERNELS=torch`), the ones a GPU engine runs. Then extend batches go through vradix's real
hooks in SGLang's order: `Scheduler.run_batch` BEFORE (the backstop, the ledger stamp), frees, and
`Scheduler.process_batch_result` BEFORE; in the overlap loop's order the next chunk is checkpointed
(`Scheduler.stash_chunked_request`) before the previous result is processed. Between a batch's `run_batch` and its
result nothing of the ledger is read; the verdict is read once, at the result, and a violation still fails its
request there with the backstop's message, inserting nothing.
"""
import pytest
import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT

from vradix.testing.harness.cache_fixture import seq

#: the calls that make the host wait for a device value
HOST_READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"})


class Counted(torch.Tensor):
    """A ledger tensor that records each host read of itself or of a tensor computed from it (`reads`)."""

    reads: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            cls.reads.append(name)
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.fixture
def device_forms(monkeypatch):
    """VRADIX_KERNELS=torch before the engine is built: its ledger binds the kernels' device forms."""
    monkeypatch.setenv("VRADIX_KERNELS", "torch")


@pytest.fixture
def counted(device_forms, env, monkeypatch):
    """`env` with its ledger on the counting stand-in and the device forms of the kernels; `reads()` lists the host
    reads and synchronise calls since the last call."""
    fx, state = env
    assert state.ledger.kernels.name == "torch" and not state.ledger.kernels.host
    monkeypatch.setattr(Counted, "reads", [])
    state.ledger.page_epoch = state.ledger.page_epoch.as_subclass(Counted)
    for owner, name in ((torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                        (torch.cuda.Stream, "synchronize")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _real=real, _n=name, **k: Counted.reads.append(_n) or _real(*a, **k))

    def reads() -> list:
        out, Counted.reads[:] = list(Counted.reads), []
        return out

    return fx, state, reads


def admitted(fx, state, tokens):
    req = fx.make_req(tokens)
    state.admit_or_raise(req)
    return req, fx.admit(req)


def cached(fx, state, prefix):
    """A finished request that put `prefix` in the tree (its forward's result processed at once)."""
    writer, _ = admitted(fx, state, prefix + [1])
    fx.prefill(writer, checkpoint=False)
    fx.process_result()
    fx.finish(writer)
    return writer


def plant_epoch(fx, state, writer, position: int, epoch: int) -> None:
    """The ledger says weights of `epoch` wrote the page of `writer`'s cached `position` (a stale page behind the
    tree)."""
    slots = fx.cache.tree_core.collect_full_device_indices(writer.last_node, fx.cache.root_node_handle(None))
    state.ledger.page_epoch[int(slots[position]) // fx.page_size] = epoch


def cached_tokens(fx):
    return fx.cache.evictable_size() + fx.cache.protected_size()


def test_an_extend_batch_reads_nothing_of_the_ledger_before_its_result(counted):
    """Normal loop: each request's forward (backstop, stamp) reads nothing; its verdict is read once, at its result,
    and a request whose prefix carries another epoch fails there and inserts nothing."""
    fx, state, reads = counted
    fx.overlap = True  # results are processed only where the test says
    P = seq(10, 64)
    writer, _ = admitted(fx, state, P + [1])
    fx.prefill(writer, checkpoint=False)
    assert reads() == [], "the forward of a request reading nothing cached read the ledger"
    fx.process_result()
    fx.finish(writer)
    reads()
    reader, hit = admitted(fx, state, P + [2])
    assert hit == 64
    fx.prefill(reader, checkpoint=False)
    assert reads() == [] and len(state.guard.verdicts) == 1, "the backstop read its verdict before the forward"
    fx.process_result()
    assert reads() == ["tolist"] and reader.discard_output_reason is None
    fx.finish(reader)
    reads()
    plant_epoch(fx, state, writer, 40, 7)  # a page other weights wrote, behind the tree
    before = cached_tokens(fx)
    bad, hit = admitted(fx, state, P + [3, 4])
    fx.prefill(bad, checkpoint=False)
    assert reads() == [] and bad.discard_output_reason is None  # not known yet: nothing waited for it
    fx.process_result()
    assert isinstance(bad.discard_output_reason, FINISH_ABORT) and bad.skip_radix_cache_insert
    assert bad.discard_output_reason.message.startswith("vradix KV backstop")
    assert state.guard.stats.violations_caught == 1
    fx.finish(bad)
    assert cached_tokens(fx) == before and fx.idle_invariant_holds()


def test_the_overlap_loop_holds_a_chunk_checkpoint_until_its_verdict_is_read(counted):
    """Overlap loop, chunked prefill: the chunk's checkpoint comes before its result; the device has not reported
    the verdict complete, so it is not read there: the chunk is not inserted yet. At the result the verdict is read
    (clean), and the next checkpoint inserts everything the held one would have. A chunk whose prefix was stale and
    whose checkpoint was held inserts nothing at all."""
    fx, state, reads = counted
    fx.overlap = True
    P = seq(10, 64)
    writer = cached(fx, state, P)
    reads()
    r, hit = admitted(fx, state, P + seq(300, 64))
    assert hit == 64
    tree_before = cached_tokens(fx)
    fx.prefill(r, upto=96, checkpoint=False)  # chunk 1 reads the cached 64
    fx.stash_chunk(r)  # the next batch is scheduled before chunk 1's result is processed
    assert reads() == [] and state.guard.stats.checkpoints_held == 1
    assert cached_tokens(fx) == tree_before, "the held chunk was inserted before its verdict was read"
    assert r.prefix_len == 96  # SGLang's path for a barred request still advances it
    fx.prefill(r, upto=112, checkpoint=False)  # chunk 2 launches while chunk 1's result is pending
    assert reads() == []
    fx.process_result()  # chunk 1's result: its verdict is read here, and found clean
    assert reads() == ["tolist"] and r.discard_output_reason is None and not r.skip_radix_cache_insert
    fx.process_result()
    reads()
    fx.stash_chunk(r)  # nothing pending for r: the checkpoint inserts both chunks
    assert cached_tokens(fx) - tree_before >= 112 - 64 - fx.page_size
    fx.finish(r)
    assert fx.idle_invariant_holds()

    # a stale prefix: the held checkpoint never inserts it, and the verdict fails the request
    plant_epoch(fx, state, writer, 0, 5)
    bad, _ = admitted(fx, state, P + seq(500, 64))
    before = cached_tokens(fx)
    fx.prefill(bad, upto=96, checkpoint=False)
    fx.stash_chunk(bad)
    assert reads() == [] and cached_tokens(fx) == before
    fx.process_result()
    assert isinstance(bad.discard_output_reason, FINISH_ABORT) and bad.skip_radix_cache_insert
    fx.finish(bad)
    assert cached_tokens(fx) == before and fx.idle_invariant_holds()


def test_a_verdict_the_device_reports_complete_is_read_at_the_checkpoint(env):
    """A ledger in host memory (a CPU engine: `kernels.on_host`) gives a verdict complete at launch: the overlap
    loop's checkpoint reads it there instead of holding the chunk, and a violation fails the request before it
    inserts anything."""
    fx, state = env
    fx.overlap = True
    P = seq(10, 64)
    writer = cached(fx, state, P)
    plant_epoch(fx, state, writer, 0, 5)
    bad, _ = admitted(fx, state, P + seq(500, 64))
    before = cached_tokens(fx)
    fx.prefill(bad, upto=96, checkpoint=False)
    fx.stash_chunk(bad)
    assert state.guard.stats.checkpoints_held == 0 and len(state.guard.verdicts) == 0  # read at the checkpoint
    assert isinstance(bad.discard_output_reason, FINISH_ABORT) and cached_tokens(fx) == before
    fx.process_result()
    fx.finish(bad)
    assert cached_tokens(fx) == before and fx.idle_invariant_holds()


def test_a_publication_reads_every_verdict_still_pending(counted):
    """A publication drains the device and may wait: a verdict whose result was never processed is read there."""
    fx, state, reads = counted
    fx.overlap = True
    P = seq(10, 64)
    cached(fx, state, P)
    r, _ = admitted(fx, state, P + [2])
    fx.prefill(r, checkpoint=False)
    reads()
    from vradix.scheduler.publication import bump_scheduler
    bump_scheduler(fx.scheduler_view(running=[r]), reason="test", label="v1")
    assert len(state.guard.verdicts) == 0 and "tolist" in reads()
    fx._results.clear()
    fx.finish(r)
    assert fx.idle_invariant_holds()
