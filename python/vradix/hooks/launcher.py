"""Launcher-process hooks (TokenizerManager): bad publication input is refused before anything is sent to a
scheduler, so it changes nothing."""
from __future__ import annotations

from vradix import epochs


def reject_bad_version_label(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerControlMixin.update_weight_version: an invalid label raises InvalidLabelError, which
    `/update_weight_version` answers with HTTP 400; the epoch and the label stay as they were."""
    epochs.check_label(obj.new_version)


async def reject_bad_update_label(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND TokenizerManager.update_weights_from_disk: refuse an invalid `weight_version` before the weights are
    touched (and before `abort_all_requests` aborts anything). The endpoint answers HTTP 400."""
    try:
        epochs.check_label(obj.weight_version)
    except epochs.InvalidLabelError as e:
        return False, str(e), 0
    return await original(tokenizer_manager, obj, *args, **kwargs)
