"""Generate a tiny random Llama (hidden 64, 2 layers, vocab 512) with a local word-level tokenizer. No hub access.

    python -m vradix.testing.models.llama --out DIR --seed N [--dtype float32|bfloat16] [--init-range 0.2]

Different seeds give different weights with the same architecture, so `update_weights_from_disk` can switch between
them. A larger `--init-range` makes the logits peaky, so greedy argmax is stable against batching noise (E2E oracles
compare output ids). Token i is the word "t<i>".
"""
from __future__ import annotations

import argparse
import json
import os

VOCAB = 512


def generate(out: str, seed: int, dtype: str = "bfloat16", init_range: float = 0.02) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(out, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         initializer_range=init_range, tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
                         pad_token_id=2, dtype=dtype)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(out)
    with open(os.path.join(out, "vradix_tiny_model.json"), "w") as f:
        json.dump({"seed": seed, "dtype": dtype, "init_range": init_range}, f)
    return out


#: the modules a tiny LoRA adapter targets, with their (in, out) features in the tiny model
LORA_TARGETS = {"q_proj": (64, 64), "v_proj": (64, 32)}


def generate_lora(out: str, seed: int, rank: int = 4, alpha: int = 8, scale: float = 0.1) -> str:
    """Write a PEFT LoRA adapter for the tiny model (`adapter_config.json` + `adapter_model.safetensors`, float32,
    q_proj and v_proj of both layers). Different seeds give different adapters of the same shape: writing another
    seed into the same directory is "retraining the adapter at the same path"."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(2):
        for module, (fan_in, fan_out) in LORA_TARGETS.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * scale
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted(LORA_TARGETS),
                   "task_type": "CAUSAL_LM", "bias": "none", "base_model_name_or_path": "vradix-tiny-llama"}, f)
    return out


def load_lora_adapter(path: str, lora_id: str):
    """SGLang's own `LoRAAdapter` for the adapter at `path`, loaded as SGLang's LoRA manager loads one (config, then
    weights through its model loader, normalised), on CPU, for the tiny model's architecture. Needs SGLang's global
    server args set (as the cache fixtures do)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.lora.lora import LoRAAdapter
    from sglang.srt.lora.lora_config import LoRAConfig
    from transformers import LlamaConfig

    base = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2)
    adapter = LoRAAdapter(lora_id, LoRAConfig(path, base_vocab_size=VOCAB), base, LoadConfig(), None)
    adapter.initialize_weights()
    return adapter


def save_tokenizer(out: str) -> None:
    """The word-level tokenizer of the tiny models: token i is the word "t<i>"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t0", eos_token="t1", pad_token="t2",
                                   unk_token="t3")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # for OpenAI chat tests
    fast.save_pretrained(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--init-range", type=float, default=0.02)
    a = p.parse_args()
    print(generate(a.out, a.seed, a.dtype, a.init_range))


if __name__ == "__main__":
    main()
