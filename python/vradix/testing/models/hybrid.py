"""Generate a tiny random NemotronH (Mamba2 + attention hybrid, hidden 64, vocab 512, float32). No hub access.

    python -m vradix.testing.models.hybrid --out DIR --seed N [--init-range 0.2]

Layers `mamba, attention, mlp, mamba`: the prefix cache of such a model holds attention KV *and* a recurrent (SSM +
conv) state per cached prefix, which is what the hybrid CPU aids (`vradix.testing.cpu_aids.hybrid`) let SGLang's CPU
engine compute. Different seeds give different weights with the same architecture (weight sets A and B for
`update_weights_from_disk`); a larger `--init-range` makes the logits peaky so greedy argmax is stable. The SSM's
`A_log`, `D` and `dt_bias` are perturbed (`0.3·randn`) so the recurrence matters to the output. The tokenizer is
`models.llama`'s: token i is the word "t<i>".

`config.json` is written in the form both HF transformers and SGLang 0.5.23 read (`SGLANG_CONFIG_FIXES`):
- `layers_block_type` uses `mamba/attention/mlp` (HF writes `linear_attention/full_attention`, which SGLang's
  `configs/nemotron_h.py` rejects; HF accepts both);
- the Mamba sizes are written under SGLang's names too (`mamba_n_groups`, `mamba_d_conv`, ...); SGLang otherwise uses
  its defaults (8 groups) and builds `in_proj` with the wrong width;
- the non-JSON `time_step_limit: [0.0, Infinity]` is dropped (both default to `(0, inf)`).
"""
from __future__ import annotations

import argparse
import json
import os

from vradix.testing.models import llama

VOCAB = llama.VOCAB
LAYERS = ["mamba", "attention", "mlp", "mamba"]
#: SGLang's config name -> HF's config name, for the Mamba sizes SGLang reads under its own names
SGLANG_MAMBA_NAMES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
                      "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size"}
#: HF layer-type names -> the names SGLang accepts
SGLANG_LAYER_NAMES = {"linear_attention": "mamba", "full_attention": "attention"}


def hf_config(init_range: float):
    from transformers import NemotronHConfig

    return NemotronHConfig(vocab_size=VOCAB, hidden_size=64, layers_block_type=list(LAYERS), num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, intermediate_size=128, mlp_hidden_act="relu2",
                           ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4,
                           expand=2, chunk_size=16, max_position_embeddings=4096, initializer_range=init_range,
                           tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                           dtype="float32")


def sglang_config_fixes(cfg: dict) -> dict:
    """The config.json HF wrote, rewritten so SGLang reads the same model (see the module docstring)."""
    cfg = dict(cfg)
    for key in ("layers_block_type", "mtp_layers_block_type"):
        cfg[key] = [SGLANG_LAYER_NAMES.get(t, t) for t in cfg[key]]
    cfg.pop("layer_types", None)
    cfg.pop("time_step_limit", None)
    for sglang_name, hf_name in SGLANG_MAMBA_NAMES.items():
        cfg[sglang_name] = cfg[hf_name]
    return cfg


def _perturb_ssm(model, gen) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1] in ("A_log", "D", "dt_bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))


def generate(out: str, seed: int, init_range: float = 0.2) -> str:
    import torch
    from transformers import NemotronHForCausalLM

    os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed)
    # transformers types `.to` through a decorator whose signature takes the model as its first argument
    model = NemotronHForCausalLM(hf_config(init_range)).to(torch.float32)  # type: ignore[arg-type]
    _perturb_ssm(model, torch.Generator().manual_seed(seed))
    model.save_pretrained(out, safe_serialization=True)
    path = os.path.join(out, "config.json")
    with open(path) as f:
        cfg = json.loads(f.read().replace("Infinity", "1e999"))  # HF writes time_step_limit's inf as bare Infinity
    with open(path, "w") as f:
        json.dump(sglang_config_fixes(cfg), f, indent=2)
    llama.save_tokenizer(out)
    with open(os.path.join(out, "vradix_tiny_model.json"), "w") as f:
        json.dump({"arch": "NemotronH", "layers": LAYERS, "seed": seed, "dtype": "float32",
                   "init_range": init_range}, f)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-range", type=float, default=0.2)
    a = p.parse_args()
    print(generate(a.out, a.seed, a.init_range))


if __name__ == "__main__":
    main()
