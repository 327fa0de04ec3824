"""Generate a tiny random Qwen2-VL (vision tower: 1 block, width 32; language model: hidden 64, 2 layers, vocab 512)
with a local word-level tokenizer and a Qwen2-VL processor. No hub access.

    python -m vradix.testing.models.vl --out DIR --seed N [--vision-seed M]

The language model's weights come from `--seed`, the vision tower's from `--vision-seed` (default: the same seed).
Two checkpoints that differ only in `--vision-seed` have the same language model, so a prompt with an image gives a
different answer on them only through the image's embedding: a test can tell a recomputed embedding from a cached one
by the output ids alone. Images are resized to 56x56 pixels, i.e. 4 image tokens (`IMAGE_PROMPT`). Token i < 508 is
the word "t<i>"; the logits are peaky (init range 0.2), so greedy ids are stable. Serving it on SGLang's CPU engine
needs `vradix.testing.cpu_aids.vlm` and the tokenizer (no `--skip-tokenizer-init`).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Optional

VOCAB = 512
SPECIAL = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
#: a prompt with one image: SGLang's Qwen-VL processor expands the pad to the image's tokens
IMAGE_PROMPT = "t5 t6 <|vision_start|><|image_pad|><|vision_end|> t7"
IMAGE_PIXELS = 56


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB - len(SPECIAL))}
    vocab.update({s: VOCAB - len(SPECIAL) + j for j, s in enumerate(SPECIAL)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t0", eos_token="t1", pad_token="t2",
                                   unk_token="t3", additional_special_tokens=list(SPECIAL))
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return fast


def config():
    from transformers import Qwen2VLConfig

    ids = {s: VOCAB - len(SPECIAL) + j for j, s in enumerate(SPECIAL)}
    return Qwen2VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                         initializer_range=0.2, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                         tie_word_embeddings=False),
        # `in_chans` is the key SGLang's Qwen2-VL vision tower reads (transformers names it `in_channels`)
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3, in_chans=3,
                           initializer_range=0.2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False, torch_dtype="float32")


def random_model(seed: int):
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    torch.manual_seed(seed)
    # transformers types `.to` through a decorator whose signature takes the model as its first argument
    return Qwen2VLForConditionalGeneration(config()).to(torch.float32)  # type: ignore[arg-type]


def generate(out: str, seed: int, vision_seed: Optional[int] = None) -> str:
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    os.makedirs(out, exist_ok=True)
    model = random_model(seed)
    if vision_seed is not None and vision_seed != seed:
        model.model.visual.load_state_dict(random_model(vision_seed).model.visual.state_dict())
    model.save_pretrained(out, safe_serialization=True)
    fast = tokenizer()
    pixels = IMAGE_PIXELS * IMAGE_PIXELS
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels),
                                 video_processor=Qwen2VLVideoProcessor(), tokenizer=fast,
                                 chat_template=fast.chat_template)
    processor.save_pretrained(out)
    with open(os.path.join(out, "vradix_tiny_model.json"), "w") as f:
        json.dump({"arch": "qwen2_vl", "seed": seed, "vision_seed": vision_seed}, f)
    return out


def write_image(path: str, seed: int) -> str:
    """A random IMAGE_PIXELS-square RGB PNG at `path`."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (IMAGE_PIXELS, IMAGE_PIXELS, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vision-seed", type=int, default=None)
    a = p.parse_args()
    print(generate(a.out, a.seed, a.vision_seed))


if __name__ == "__main__":
    main()
