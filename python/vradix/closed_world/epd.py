"""Encoder disaggregation (EPD) is refused at startup while vradix is active.

SGLang 0.5.23's EPD splits a VLM into an encoder server (`--encoder-only`, `disaggregation/encoder/server.py`) and
language servers (`--language-only`) that receive its image embeddings. The encoder keeps its own embedding cache and,
with `--enable-mm-global-cache`, a store shared across processes keyed `emb_{hash}`: the item's content hash, with no
weight identity. The encoder server has no weight-update path, and a publication to a language server neither reaches
nor invalidates the encoder's caches, so after a publication a language server would be fed embeddings of a vision
tower nobody published (and every process sharing the global store reads them). vradix cannot version that key
without changing SGLang's store protocol, so each of these flags stops the launch before any process starts.

Invariant: an engine that starts with vradix active computes every multimodal embedding it uses in its own scheduler
process, whose embedding cache each publication clears (`vradix.core.weight_derived`).
"""
from __future__ import annotations

from vradix.closed_world.unversioned import UnversionedPathError

#: (ServerArgs field, its flag): each makes embeddings cross processes without a weight identity
EPD_FLAGS = (
    ("encoder_only", "--encoder-only"),
    ("language_only", "--language-only"),
    ("enable_mm_global_cache", "--enable-mm-global-cache"),
)


class EncoderDisaggregationError(UnversionedPathError):
    """A launch whose multimodal embeddings would come from a cache vradix cannot version."""


def check(server_args) -> None:
    """Raise EncoderDisaggregationError, naming the flags and the alternative, when `server_args` sets any of
    `EPD_FLAGS`."""
    used = [flag for field, flag in EPD_FLAGS if getattr(server_args, field, False)]
    if used:
        raise EncoderDisaggregationError(
            f"vradix refuses {' and '.join(used)}: encoder-disaggregated (EPD) image embeddings are cached by content "
            "hash only (the global store's key emb_{hash} carries no weight identity), and SGLang 0.5.23 has no "
            "weight-update path for the encoder server, so a publication cannot invalidate them. Serve the VLM "
            "without encoder disaggregation (drop --encoder-only / --language-only / --enable-mm-global-cache): its "
            "embedding cache is then in the scheduler process and cleared at every publication; or set "
            "VRADIX_DISABLE=1 for stock behaviour.")
