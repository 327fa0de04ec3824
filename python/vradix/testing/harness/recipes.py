"""The trainer recipes of docs/recipes.md, run as written: each is a fenced `python` block right after a
`<!-- recipe: NAME -->` marker, executed here as a module, and handed the data shapes of its framework.

The frameworks are not installed here, so their containers are built with the field names and types they have
upstream (each named below with the file that defines it); the recipes use nothing else of them:
- miles / slime: `Sample` (miles `miles/utils/types.py`, slime `slime/utils/types.py`): `tokens`,
  `response_length`, `loss_mask`, `rollout_log_probs`, `weight_versions`, `metadata`;
- verl: a `DataProto` whose `.batch` maps keys to [batch, response_length] tensors (`response_mask`,
  `old_log_probs`; the actor reads `rollout_is_weights` when present, `verl/workers/actor/dp_actor.py`);
- AReaL: the dict of [1, seq] tensors a workflow returns (`input_ids`, `logprobs`, `loss_mask`, `versions`,
  `attention_mask`; `areal/workflow/rlvr.py`).
"""
from __future__ import annotations

import pathlib
import re
import types
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

#: docs/recipes.md of the checkout (python/vradix/testing/harness -> the repository root)
RECIPES = pathlib.Path(__file__).resolve().parents[4] / "docs" / "recipes.md"
BLOCK = re.compile(r"<!-- recipe: ([\w-]+) -->\s*```python\n(.*?)^```", re.S | re.M)


def blocks() -> Dict[str, str]:
    """{recipe name: its code} from docs/recipes.md."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(RECIPES.read_text())}


def load(name: str) -> types.ModuleType:
    """The recipe `name` executed as a module (its functions are its attributes)."""
    code = blocks().get(name)
    if code is None:
        raise KeyError(f"docs/recipes.md has no recipe {name!r} (has {sorted(blocks())})")
    module = types.ModuleType(f"recipe_{name.replace('-', '_')}")
    exec(compile(code, f"docs/recipes.md:{name}", "exec"), module.__dict__)
    return module


@dataclass
class MilesSample:
    """The fields of miles' / slime's `Sample` a rollout fills (same names and types as upstream)."""

    tokens: List[int] = field(default_factory=list)
    response_length: int = 0
    loss_mask: Optional[List[int]] = None
    rollout_log_probs: Optional[List[float]] = None
    weight_versions: List[str] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


class VerlBatch:
    """A verl `DataProto`'s tensor side: `.batch[key]` is a [batch, response_length] tensor."""

    def __init__(self, tensors: Dict[str, Any]):
        self.batch = dict(tensors)


def check_all(response: dict, prompt_ids: List[int], trainer_version: Any, max_staleness: int = 1) -> dict:
    """Run the three recipes on one native `/generate` response (with `output_token_logprobs`, integer version
    labels) and check what each wrote against `TokenVersions` read directly: the tokens, the log-probs aligned
    with the engine's, the mask, the TIS weights (1 off the crossing tokens; the trainer's log-probs here are the
    engine's + 0.1, so a crossing token's weight is exp(0.1)), the per-token versions. Returns what they wrote."""
    import math

    import torch

    from vradix.trainer import TokenVersions, mask

    tv = TokenVersions.from_response(response)
    n, out_ids = len(tv), response["output_ids"]
    engine = [x[0] for x in response["meta_info"]["output_token_logprobs"]]
    keep_own = mask(tv, max_staleness=max_staleness)

    sample = MilesSample(tokens=list(prompt_ids))
    assert load("miles").add_turn(sample, response, max_staleness) == tv
    assert sample.tokens == list(prompt_ids) + out_ids and sample.response_length == n
    assert sample.rollout_log_probs == engine and sample.loss_mask == keep_own
    assert sample.weight_versions == [response["meta_info"]["weight_version"]]
    assert sample.metadata["vradix"] == [tv.columns()]

    width = n + 3                                                     # right padding, as verl's batches have
    old = torch.tensor([engine + [0.0] * 3]) + 0.1
    batch = VerlBatch({"old_log_probs": old, "response_mask": torch.tensor([[1] * n + [0] * 3])})
    load("verl").add_vradix_corrections(batch, [response], trainer_version, max_staleness)
    w = batch.batch["rollout_is_weights"]
    assert w.shape == (1, width) and w.dtype == old.dtype
    want = [math.exp(0.1) if k == "crossing" else 1.0 for k in tv.kind] + [0.0] * 3
    assert torch.allclose(w[0], torch.tensor(want, dtype=w.dtype), atol=1e-5), (w, want)
    lagging = mask(tv, trainer_version, max_staleness)
    assert batch.batch["response_mask"].tolist() == [lagging + [0] * 3]

    areal = load("areal").episode_tensors(response, prompt_ids, max_staleness)
    p = len(prompt_ids)
    assert {k: tuple(v.shape) for k, v in areal.items()} == {k: (1, p + n) for k in areal}
    assert areal["input_ids"][0].tolist() == list(prompt_ids) + out_ids
    assert areal["versions"][0, p:].tolist() == [int(v) for v in tv.sampler] and areal["versions"][0, :p].eq(-1).all()
    assert areal["loss_mask"][0].tolist() == [0] * p + keep_own
    assert torch.allclose(areal["logprobs"][0, p:], torch.tensor(engine, dtype=areal["logprobs"].dtype))
    return {"miles": sample, "verl": batch, "areal": areal, "tv": tv}
