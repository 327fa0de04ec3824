"""The engine without a radix cache (`--disable-radix-cache`, `core.state.TreelessState`): no tree and so no epoch.
A publication on it drops the weight-derived caches the old weights filled, once (`core.weight_derived`); a flush by
itself drops them too, recorded as a flush, not a publication.

`TreelessEngine` is the variant of `scheduler.publication.VersionedEngine` with the same small interface, which
`scheduler.publication.Publication` drives (`holder`, `tapping`, `declaration_refusal`, `prepare_relabel`, `publish`,
`describe`, `discard_drain`, `flush_within`, `flush`).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Optional, Union

from vradix.core import weight_derived
from vradix.core.epochs import current_label
from vradix.core.state import Bump, TreelessState

logger = logging.getLogger("vradix")


class TreelessEngine:
    """A scheduler without a radix cache. Built per use (`scheduler.publication.engine_of`), it keeps no state of its
    own: its records are the `TreelessState`'s."""

    #: what a publication does on this engine, for the responses that announce it
    PUBLISHES = "the weight-derived caches are dropped"

    def __init__(self, scheduler, treeless: TreelessState):
        self.scheduler, self.treeless = scheduler, treeless

    @property
    def holder(self) -> TreelessState:
        """Where the open publication and bucketed update are registered."""
        return self.treeless

    def tapping(self):
        """No identity to prove: nothing is recorded."""
        return contextlib.nullcontext()

    def declaration_refusal(self, label) -> Optional[str]:
        """No identity is declared without an epoch: no refusal."""
        return None

    def prepare_relabel(self, new_version) -> bool:
        """A new label is always accepted; nothing drains first."""
        return True

    def publish(self, reason: str, *, label, weights_changed: bool = True) -> dict:
        """A publication's step: the weight-derived caches are dropped, once, and counted as a publication."""
        return self.drop(reason, label, is_publication=True)

    def describe(self, record: Union[Bump, dict]) -> str:
        assert isinstance(record, dict), "a treeless engine's publication records what it dropped"
        return (f"vradix: {record['reason']} without a radix cache: {record['mm_embeddings_cleared']} multimodal "
                f"embedding(s), {record['position_grids_cleared']} position grid(s) cleared")

    def discard_drain(self) -> None:
        """No bump takes a drain here: nothing to discard."""

    def flush_within(self, publication, sglang_flush) -> bool:
        """A flush inside an open publication: SGLang's own; the publication drops the caches itself."""
        return sglang_flush()

    def flush(self, sglang_flush) -> bool:
        """A flush by itself: SGLang's own, then the weight-derived caches are dropped (a flush, not a
        publication). Returns whether the cache was flushed."""
        ok = sglang_flush()
        if ok:
            self.drop("flush", current_label(), is_publication=False)
        return ok

    def drop(self, reason: str, label, *, is_publication: bool) -> dict:
        """Drop the weight-derived caches the old weights filled (`weight_derived.clear_at_publication`) and record
        it (`TreelessState.record`). Returns the record."""
        cleared = weight_derived.clear_at_publication(self.scheduler)
        self.treeless.record({"reason": reason, "label": label, "mm_embeddings_cleared": cleared.mm_embeddings,
                              "position_grids_cleared": cleared.position_grids}, is_publication)
        logger.info("vradix: %s without a radix cache: %d multimodal embedding(s), %d position grid(s) cleared",
                    reason, cleared.mm_embeddings, cleared.position_grids)
        assert self.treeless.last is not None  # recorded just now
        return self.treeless.last
