"""The trainer's side: per-token weight versions read from a finished response (native `/generate` or OpenAI), and
the corrections RL trainers apply with them (a mask, truncated importance weights).

Client-side only: nothing here imports SGLang or the serving package; numpy and torch are optional.

    tv = TokenVersions.from_response(response)      # per output token: sampler, kv_oldest, kv_newest, staleness, kind
    keep = mask(tv, trainer_version=step, max_staleness=1)
    w = importance_weights(tv, trainer_logprobs, cap=2.0, kinds=("crossing",))
"""
from vradix.trainer.corrections import importance_weights, mask, pad_rows, to_array, truncated_weights
from vradix.trainer.versions import (CROSSING, FRESH, KIND_CODES, KINDS, STALE, ResponseError, TokenVersions, Version,
                                     version)

__all__ = ["TokenVersions", "Version", "ResponseError", "version", "FRESH", "CROSSING", "STALE", "KINDS",
           "KIND_CODES", "mask", "importance_weights", "truncated_weights", "pad_rows", "to_array"]
