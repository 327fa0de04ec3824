"""`vradix.core.published`: the identity of what was published into a model does not depend on the TP layout.

The ranks of a TP group each see the whole published stream (the unsharded tensors that reach `load_weights`) and
digest only the names they own; their shares, merged, give the same identity as a single rank that digested all.
Here every rank of a layout is a `Tap` of its own model copy, fed the same stream, and `merge` combines their shares
as the all-gather would (`vradix.collectives.gather`; the TP=2 server test runs the real collective)."""
import pytest
import torch

from vradix.core import published


class Loader(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.loaded = []

    def load_weights(self, weights):
        self.loaded.extend(name for name, _ in weights)
        return set(self.loaded)


def stream(seed=0, n=24):
    g = torch.Generator().manual_seed(seed)
    return [(f"model.layers.{i // 4}.w{i % 4}", torch.randn(3 + i % 5, 7, generator=g)) for i in range(n)]


def identity_on(world: int, weights, salt="Llama|float32|None", order=None):
    shares, names = [], None
    for rank in range(world):
        model = Loader()
        items = list(weights) if order is None else [weights[i] for i in order]
        with published.tapping(model, rank, world):
            model.load_weights(iter(items))
        pending = published.of(model).take()
        shares.append(pending.share())
        names = pending.names
    merged = published.merge(shares, names)
    return published.identity_of(merged, salt, None, None)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_layout_proves_the_identity_one_rank_does(world):
    one = identity_on(1, stream())
    assert one[0] == published.Outcome.COMPLETE
    assert identity_on(world, stream()) == one


def test_the_identity_names_the_bytes_the_dtype_the_shape_and_the_engine():
    base = identity_on(2, stream())[1]
    flipped = stream()
    flipped[5][1].view(torch.int32)[0, 0] ^= 1  # one bit
    assert identity_on(2, flipped)[1] != base
    cast = [(n, t.double()) for n, t in stream()]
    assert identity_on(2, cast)[1] != base
    reshaped = [(n, t.reshape(-1)) if i == 3 else (n, t) for i, (n, t) in enumerate(stream())]
    assert identity_on(2, reshaped)[1] != base
    assert identity_on(2, stream(), salt="Llama|bfloat16|None")[1] != base
    assert identity_on(2, stream(), order=list(reversed(range(24))))[1] == base  # order is not content


def test_each_rank_digests_only_the_names_it_owns():
    weights = stream(n=64)
    owned = []
    for rank in range(4):
        model = Loader()
        with published.tapping(model, rank, 4):
            model.load_weights(iter(weights))
        pending = published.of(model).pending
        assert len(pending.names) == 64  # every rank sees every name
        owned.append(set(pending.lanes))
    assert set().union(*owned) == {n for n, _ in weights} and sum(map(len, owned)) == 64  # each name once
    assert all(8 <= len(o) <= 24 for o in owned)  # the digest work is spread


def test_ranks_that_saw_different_names_are_inconsistent_not_proven():
    shares, names = [], []
    for rank, weights in enumerate((stream(), stream()[:-1])):
        model = Loader()
        with published.tapping(model, rank, 2):
            model.load_weights(iter(weights))
        pending = published.of(model).take()
        shares.append(pending.share())
        names.append(pending.names)
    assert published.identity_of(published.merge(shares, names[0]), "s", None, None) == \
        (published.Outcome.INCONSISTENT, None)


def test_a_complete_publication_is_a_fresh_start_and_a_partial_one_chains():
    start = published.merge([tap_once(stream())], {n for n, _ in stream()})
    _, start_hex = published.identity_of(start, "s", None, None)
    again = published.merge([tap_once(stream())], {n for n, _ in stream()})
    assert published.identity_of(again, "s", start.names, "fp:prev") == (published.Outcome.COMPLETE, start_hex)
    part = stream()[:3]
    partial = published.merge([tap_once(part)], {n for n, _ in part})
    outcome, hex_ = published.identity_of(partial, "s", start.names, "fp:prev")
    assert outcome == published.Outcome.CHAINED and hex_ == published.chained("fp:prev", published.fingerprint_of(
        partial.records, "s"))
    assert published.identity_of(partial, "s", None, "fp:prev")[0] == published.Outcome.CHAINED  # untapped start
    assert published.identity_of(partial, "s", start.names, "fp:other")[1] != hex_  # another history


def tap_once(weights):
    model = Loader()
    with published.tapping(model, 0, 1):
        model.load_weights(iter(weights))
    return published.of(model).take().share()


def test_tapping_is_reentrant_and_restores_the_model():
    model = Loader()
    with published.tapping(model, 0, 1):
        with published.tapping(model, 0, 1):  # an update's tap around the loader's: one tap per tensor
            assert model.load_weights(iter(stream(n=4))) == {n for n, _ in stream(n=4)}
        assert published.of(model).pending.tensors == 4
    assert "load_weights" not in model.__dict__ and published.of(model).tapping == 0
    model.load_weights(iter(stream(n=2)))  # untapped again
    assert published.of(model).pending.tensors == 4


def test_a_load_that_raises_taints_the_publication():
    model = Loader()

    def broken():
        yield stream(n=1)[0]
        raise OSError("torn shard")
    with pytest.raises(OSError), published.tapping(model, 0, 1):
        model.load_weights(broken())
    merged = published.merge([published.of(model).take().share()], {stream(n=1)[0][0]})
    assert published.identity_of(merged, "s", None, None) == (published.Outcome.TAINTED, None)
