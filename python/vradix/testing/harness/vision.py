"""Stand-ins for the weight-derived caches' tests (`test/core/test_weight_derived.py`, and the publication entry points
of `test/hooks/test_publication_hooks.py`): SGLang's real vision position-embedding modules, an idle scheduler whose
flush is SGLang's own reset, and an engine started without a radix cache."""
from __future__ import annotations

import dataclasses
import types

import torch
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from vradix.core.state import attach_treeless
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.engine import Engine, StubScheduler, updater_for


def vision_tower():
    """SGLang's real MoonViT and PaddleOCR-VL position-embedding modules, in one module tree, in eval mode."""
    from sglang.srt.models.kimi_vl_moonvit import Learnable2DInterpPosEmb
    from sglang.srt.models.paddleocr_vl import SiglipVisionEmbeddings
    tower = torch.nn.Module()
    tower.moonvit = Learnable2DInterpPosEmb(4, 4, 8)
    tower.paddle = SiglipVisionEmbeddings(types.SimpleNamespace(hidden_size=8, image_size=8, patch_size=2,
                                                                num_channels=3))
    return tower.eval()


def serve(scheduler, model):
    scheduler.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))



class IdleStubScheduler(StubScheduler):
    """The stand-in scheduler, idle, with what SGLang's own idle `Scheduler.flush_cache` resets besides the (real)
    cache and pools: the grammar manager, the metrics reporter, no draft worker."""

    def __init__(self, fx):
        super().__init__(fx, [])
        self.token_to_kv_pool_allocator, self.draft_worker = fx.allocator, None
        self.grammar_manager = types.SimpleNamespace(clear=lambda: None)
        self.metrics_reporter = types.SimpleNamespace(reset_metrics=lambda: None, is_stats_logging_rank=False)


class TreelessEngine(Engine):
    """An engine started with --disable-radix-cache: SGLang's real UnifiedRadixCache with `disable=True` (no prefix
    sharing), idle, serving the vision tower; vradix attached as `attach_to_scheduler` attaches it there."""

    def __init__(self):
        fx = build_cache("rust", 1, kv_tokens=1024)
        fx = dataclasses.replace(fx, cache=UnifiedRadixCache(dataclasses.replace(fx.cache.cache_init_params,
                                                                                 disable=True)))
        assert not fx.cache.supports_prefix_sharing()
        self.fx, self.treeless = fx, attach_treeless(fx.cache)
        self.scheduler = IdleStubScheduler(fx)
        self.updater, self.touched = updater_for(self.scheduler), 0
        self.tower = vision_tower()
        serve(self.scheduler, self.tower)
