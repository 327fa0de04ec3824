"""The hybrid (NemotronH) E2E tests' prompts and their oracle: HF transformers' greedy generate on the tiny hybrid,
float32, with its own torch reference ops (no SGLang code). Shared by the non-P/D and the P/D hybrid tests
(`test/conftest.py` computes it once per session).

The prompts are shaped for `--mamba-radix-cache-strategy no_buffer`, which snapshots a recurrent state only where a
request stopped (end of its prompt, or prompt+output-1 at finish): a prompt that *extends* an earlier prompt P hits
at len(P); the same prompt sent twice does not hit.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

SHORT = [5, 17, 99, 3, 250, 77, 8, 9, 10, 11]
PREFIX = [(i * 7) % 500 + 5 for i in range(48)]
EXTENDED = PREFIX + [31, 32, 33]
EXTENDED_AGAIN = EXTENDED + [41, 42]
SIBLING = PREFIX + [61, 62, 63]
#: two prompts sharing a 40-token prefix that no request stopped at
FORKED = [[(i * 11) % 500 + 3 for i in range(40)] + tail for tail in ([71, 72], [81, 82])]
#: the prompts the oracle answers, on each weight set
ORACLE_PROMPTS = (SHORT, PREFIX, EXTENDED, EXTENDED_AGAIN, SIBLING)
NEW_TOKENS = 6


def hf_greedy(weights: Dict[str, str], prompts: Sequence[Sequence[int]] = ORACLE_PROMPTS,
              new_tokens: int = NEW_TOKENS) -> Dict[Tuple[str, tuple], list]:
    """{(weights name, prompt as a tuple): the `new_tokens` HF greedy tokens after it} for each checkpoint of
    `weights` (name -> path)."""
    import torch
    from transformers import AutoModelForCausalLM

    out = {}
    for name, path in weights.items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for prompt in prompts:
            with torch.no_grad():
                ids = model.generate(torch.tensor([list(prompt)]), max_new_tokens=new_tokens, do_sample=False,
                                     min_new_tokens=new_tokens)
            out[name, tuple(prompt)] = ids[0, len(prompt):].tolist()
    return out
