"""Generate a tiny random Llama (hidden 64, 2 layers, vocab 512) with a local word-level tokenizer. No hub access.

    python -m vradix.testing.tiny_model --out DIR --seed N [--dtype float32|bfloat16] [--init-range 0.2]

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
                         pad_token_id=2, torch_dtype=dtype)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(out)
    with open(os.path.join(out, "vradix_tiny_model.json"), "w") as f:
        json.dump({"seed": seed, "dtype": dtype, "init_range": init_range}, f)
    return out


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
