"""Weight-derived caches outside the KV cache: what SGLang 0.5.23 computes from the weights once and reuses, so a
publication must drop it for the next request to recompute it from the new weights.

- The multimodal embedding cache (`vradix.core.mm_embeddings`): encoder outputs keyed by item content only.
- Interpolated position-embedding grids of two vision towers, memoised per grid shape and never recomputed after a
  weight update:
  - MoonViT (`models/kimi_vl_moonvit.py`, Kimi-VL and the towers built on `MoonVitPretrainedModel`):
    `Learnable2DInterpPosEmb._interpolated_pos_emb_cache`, keyed by (grid, dtype, device);
  - PaddleOCR-VL (`models/paddleocr_vl.py`): `SiglipVisionEmbeddings.cache_position_embedding` and its LFU hit
    counts `cache_position_count`, keyed by grid.
  Both are plain dicts filled in the forward pass on the scheduler thread; an empty dict is their initial state, so
  clearing them makes the next forward interpolate the current weights.

`clear_at_publication` runs from the scheduler thread of each rank at every publication (an epoch bump, or on an
engine without a radix cache, `scheduler.treeless.TreelessEngine.publish`), after the weights changed and before the next
forward pass. On a radix cache it is a step of the engines whose model can fill a weight-derived cache (`present`, read
once at startup): a text-only model never runs the encoder routine that fills the multimodal embedding cache, nor a
vision tower with a grid memo. Invariant: after it, no cached embedding or position grid predates the current
weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from vradix.core import mm_embeddings

#: (class name, module that defines it, its grid memo, the memo's bookkeeping dicts): exact classes, so a model that
#: subclasses one with its own semantics is not touched by name alone
POSITION_GRID_CACHES = (
    ("Learnable2DInterpPosEmb", "sglang.srt.models.kimi_vl_moonvit", "_interpolated_pos_emb_cache", ()),
    ("SiglipVisionEmbeddings", "sglang.srt.models.paddleocr_vl", "cache_position_embedding",
     ("cache_position_count",)),
)


@dataclass
class Cleared:
    """What one publication dropped."""

    mm_embeddings: int = 0
    position_grids: int = 0


def position_grid_memos(model) -> list:
    """(grid memo, its bookkeeping dicts) for each module of `model` that memoises position grids (module doc)."""
    memos: list[tuple[object, list[object]]] = []
    if model is None or not hasattr(model, "modules"):
        return memos
    for module in model.modules():
        cls = type(module)
        for name, defined_in, memo, bookkeeping in POSITION_GRID_CACHES:
            if cls.__name__ == name and cls.__module__ == defined_in:
                memos.append((getattr(module, memo), [getattr(module, b) for b in bookkeeping]))
    return memos


def clear_position_grids(model) -> int:
    """Empty every position-grid memo of `model` (and its bookkeeping). Returns how many grids were dropped."""
    dropped = 0
    for memo, bookkeeping in position_grid_memos(model):
        dropped += len(memo)
        memo.clear()
        for d in bookkeeping:
            d.clear()
    return dropped


def served_model(scheduler):
    """The model the scheduler's target worker serves, or None (a scheduler stand-in without one)."""
    runner = getattr(getattr(scheduler, "tp_worker", None), "model_runner", None)
    return getattr(runner, "model", None)


def present(scheduler) -> bool:
    """Whether the scheduler's model can fill a weight-derived cache: a multimodal model (only its forward fills the
    multimodal embedding cache), or one with a position-grid memo. True when the model config is unknown."""
    config = getattr(scheduler, "model_config", None)
    if config is None or getattr(config, "is_multimodal", True):
        return True
    return bool(position_grid_memos(served_model(scheduler)))


def clear_at_publication(scheduler) -> Cleared:
    """Drop every weight-derived cache of this scheduler's process (see the module doc)."""
    return Cleared(mm_embeddings=mm_embeddings.clear_all(),
                   position_grids=clear_position_grids(served_model(scheduler)))
