"""Weights SGLang derives after loading, and the update paths that skip or hide that step.

- `load_format="direct"` tensor updates (`update_weights_from_tensor`) copy each named tensor into its parameter
  (`_model_load_weights_direct`) and never call the model's `post_load_weights`, which derives weights from loaded
  ones: MLA models (DeepSeek V2/V3, Kimi, GLM-5 and the others built on `deepseek_weight_loader`) split `kv_b_proj`
  into `w_kc`/`w_vc` there. After such an update the served model would mix new weights with weights derived from the
  old ones. vradix refuses such an update before anything is loaded when the model defines `post_load_weights`
  (`direct_update_refusal`); `load_format=None` (the model's own `load_weights`) runs the derivation.
- `update_weights_from_ipc` (checkpoint-engine) runs SGLang's post-hook (`process_weights_after_loading`, then
  `post_load_weights`) inside a `try` that only logs "Post-hook processing failed" as a warning, and the update then
  reports success. `PostHookFailures` catches that warning during the call, so vradix turns the call into a failed
  update: its label is not applied and it is not a publication (its weights were touched, so the epoch still bumps
  once, conservatively, as for every failed update that may have touched weights).
"""
from __future__ import annotations

import logging
from typing import Optional

#: the logger of SGLang's checkpoint-engine worker (`checkpoint_engine/checkpoint_engine_worker.py`)
IPC_WORKER_LOGGER = "sglang.srt.checkpoint_engine.checkpoint_engine_worker"
#: the start of the warning it logs when the post-hook raised
POST_HOOK_FAILED = "Post-hook processing failed"


def derives_weights_after_load(model) -> bool:
    """Whether `model` derives weights in `post_load_weights` (what SGLang's `loader.post_load_weights` calls)."""
    return model is not None and callable(getattr(model, "post_load_weights", None))


def direct_update_refusal(load_format, models) -> Optional[str]:
    """The reason a `load_format="direct"` update must not run on `models` (target, then draft), or None."""
    if load_format != "direct":
        return None
    for model in models:
        if derives_weights_after_load(model):
            return (f"vradix refused update_weights_from_tensor(load_format='direct'): {type(model).__name__} "
                    "derives weights after loading (post_load_weights, e.g. MLA w_kc/w_vc from kv_b_proj), which the "
                    "direct loader skips, so the served weights would mix new tensors with ones derived from the old. "
                    "Nothing was loaded. Send the bucket with load_format=None (the model's load_weights runs the "
                    "derivation)")
    return None


class PostHookFailures(logging.Handler):
    """While open, records every "Post-hook processing failed" warning SGLang's IPC worker logs (the handler is on
    that logger only, and its level is lowered to WARNING for the call if it was higher)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.failures: list = []
        self._logger = logging.getLogger(IPC_WORKER_LOGGER)
        self._level = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(POST_HOOK_FAILED):
            self.failures.append(message)

    def __enter__(self) -> "PostHookFailures":
        self._level = self._logger.level
        if self._logger.getEffectiveLevel() > logging.WARNING:
            self._logger.setLevel(logging.WARNING)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
