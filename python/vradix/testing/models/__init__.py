"""Tiny float32 models with peaky logits, generated locally for CPU tests and the demo: a Llama (`llama`), a
Mamba2 hybrid NemotronH (`hybrid`) and a Qwen2-VL (`vl`)."""
