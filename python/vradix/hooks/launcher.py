"""Launcher hooks (launcher process: the TokenizerManager): bad publication input is refused before anything is sent to a
scheduler, so it changes nothing; a bucketed update holds generation from its begin to its end.

Every refusal here is an early, friendlier copy: the scheduler process, where vradix's fail-closed install is
guaranteed, decides each one again where it receives the call (docs/fail-closed.md, "Where each check is decided")."""
from __future__ import annotations

import argparse
import functools
import logging
import os

from vradix import identity, startup
from vradix.hooks import pd_launcher
from vradix.closed_world import epd, unversioned
from vradix.core import epochs, staleness
from vradix.core.epochs import InvalidUpdateRequest, check_disk_update_request

logger = logging.getLogger("vradix")


def refuse_unversioned_paths_at_startup(_result, server_args, *args, **kwargs):
    """AFTER ServerArgs.check_server_args (launcher, before any scheduler starts): a flag that turns on a path vradix
    cannot version (`vradix.closed_world.unversioned.REFUSALS`, and the EPD flags of `vradix.closed_world.epd`) stops the launch with
    UnversionedPathError naming the flag."""
    unversioned.check(server_args)
    epd.check(server_args)
    staleness.check_server(server_args, staleness.server_window())


def reject_bad_version_label(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerControlMixin.update_weight_version: an invalid label raises InvalidLabelError, which
    `/update_weight_version` answers with HTTP 400; the epoch and the label stay as they were."""
    epochs.check_label(obj.new_version)


async def reject_bad_update_request(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND TokenizerManager.update_weights_from_disk: refuse a malformed request (`check_disk_update_request`)
    before the weights are touched and before `abort_all_requests` aborts anything. The endpoint answers HTTP 400;
    the epoch, the label and the paused state are unchanged."""
    try:
        check_disk_update_request(obj)
    except (epochs.InvalidLabelError, InvalidUpdateRequest) as e:
        return False, str(e), 0
    return await original(tokenizer_manager, obj, *args, **kwargs)


async def hold_generation_for_bucketed_update(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND TokenizerControlMixin.begin_weight_update: when generation is not paused, pause it in place first, so no
    forward pass reads half-written weights until the bucketed update ends
    (`release_generation_after_bucketed_update`).

    Why the launcher holds first: an unpaused TokenizerManager runs every call of a bucketed update under its
    `model_update_lock` writer lock, which waits for every in-flight request to finish; a request admitted between
    two buckets and then held by a scheduler-only pause would never finish, and the next bucket would wait forever.
    Pausing here keeps new requests in the TokenizerManager. The scheduler decides the hold too
    (`scheduler.publication.Publication.hold_generation`): a bucketed update whose begin finds the scheduler unpaused
    (this copy absent) pauses it in place there and refuses the requests that reach it until the end, so neither a
    half-written forward nor that wait happens. The in-place pause also makes in-flight requests cross the
    publication with their KV, as with an explicit pause. With several tokenizer workers SGLang broadcasts the pause
    to every worker, so requests wait in each worker; the bucketed update's end resumes generation whichever worker
    it reaches (`release_generation_after_bucketed_update`)."""
    from sglang.srt.managers.io_struct import PauseGenerationReqInput

    paused_here = not tokenizer_manager.is_pause
    if paused_here:
        await tokenizer_manager.pause_generation(PauseGenerationReqInput(mode="in_place"))
    try:
        success, message = await original(tokenizer_manager, obj, *args, **kwargs)
    except BaseException:
        if paused_here:  # no bucketed update was opened: do not leave generation paused behind an error
            await resume_generation(tokenizer_manager)
        raise
    if success:
        tokenizer_manager._vradix_bucketed_update_open = True
    if paused_here:
        if success:
            tokenizer_manager._vradix_bucketed_update_paused = True
            message += " [vradix: generation paused in place until end_weight_update]"
        else:
            await resume_generation(tokenizer_manager)
    return success, message


def several_tokenizer_workers(tokenizer_manager) -> bool:
    """Whether the engine serves through several tokenizer workers (`--tokenizer-worker-num` above 1)."""
    return int(getattr(getattr(tokenizer_manager, "server_args", None), "tokenizer_worker_num", 1) or 1) > 1


async def release_generation_after_bucketed_update(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND TokenizerControlMixin.end_weight_update: resume generation once the bucketed update ended, only if its
    begin paused it (an explicit pause stays the caller's) and nobody resumed it meanwhile. With several tokenizer
    workers a paused engine is resumed at the end whoever paused it (the begin's record is in another process): the
    weights are published by then, so generation resuming before the caller's own continue reads only the new epoch."""
    success, message = await original(tokenizer_manager, obj, *args, **kwargs)
    if success or NO_BUCKETED_UPDATE_OPEN in message:
        tokenizer_manager._vradix_bucketed_update_open = False
    # with several tokenizer workers the begin may have reached another worker, whose record this one cannot read:
    # every worker's pause is SGLang's broadcast one, so a paused engine at the end is resumed
    held = getattr(tokenizer_manager, "_vradix_bucketed_update_paused", False) or (
        several_tokenizer_workers(tokenizer_manager) and tokenizer_manager.is_pause)
    if held and not success:
        message += (" [vradix: generation stays paused (the bucketed update's begin paused it); resume it with "
                    "/continue_generation once the bucketed update is resolved]")
    elif held:
        tokenizer_manager._vradix_bucketed_update_paused = False
        if tokenizer_manager.is_pause:
            await resume_generation(tokenizer_manager)
            message += " [vradix: generation resumed]"
    return success, message


#: what SGLang's end_weight_update answers when no bucketed update is open (it is over either way; SGLang's own
#: text calls it a weight-update session)
NO_BUCKETED_UPDATE_OPEN = "no weight-update session is open"


def refuse_continue_inside_bucketed_update(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerManager.continue_generation (and a multi-tokenizer worker's): inside a bucketed update this
    TokenizerManager opened, `/continue_generation` is refused with HTTP 400 naming `end_weight_update`;
    generation stays paused. The bucketed update is open from a successful begin to an end that closed it
    (`hold_generation_for_bucketed_update`, `release_generation_after_bucketed_update`); the scheduler refuses it too
    (`hooks.control.refuse_continue_inside_bucketed_update`)."""
    from fastapi import HTTPException

    from vradix.hooks.control import CONTINUE_INSIDE_BUCKETED_UPDATE

    if getattr(tokenizer_manager, "_vradix_bucketed_update_open", False):
        raise HTTPException(status_code=400, detail=CONTINUE_INSIDE_BUCKETED_UPDATE)


def refuse_relaxed_speculative_acceptance(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerControlMixin.set_internal_state: a speculative acceptance threshold below 1 is refused with
    HTTP 400 (`scheduler.reconfigure.relaxed_acceptance`, the rule the scheduler decides again where it receives the
    call), as the same flags are at launch: relaxed acceptance lets the draft model, whose state no publication
    versions, decide outputs. Nothing is sent to a scheduler; other keys pass."""
    from fastapi import HTTPException

    from vradix.scheduler.reconfigure import relaxed_acceptance

    reason = relaxed_acceptance(dict(obj.server_args or {}))
    if reason is not None:
        raise HTTPException(status_code=400, detail=reason)


async def resume_generation(tokenizer_manager) -> None:
    from sglang.srt.managers.io_struct import ContinueGenerationReqInput
    await tokenizer_manager.continue_generation(ContinueGenerationReqInput())


FLAG = "--vradix-weight-identity"


def add_identity_flag(_result, parser, *args, **kwargs):
    """AFTER ServerArgs.add_cli_args: the server flags that choose how each epoch's weight identity is set and the
    bounded-staleness window (`vradix.core.staleness`); and upstream SGLang's `--enable-prefill-weight-versions`
    where this SGLang's parser lacks it (0.5.23), accepted so that an engine launched with it starts and miles' check
    for it passes. It changes nothing: vradix reports `prefill_weight_versions` on every response (docs/provenance.md).
    An SGLang that has the flag keeps its own."""
    startup.add_upstream_flag(parser)  # unless SGLang has its own (after 0.5.23) or vradix.startup added it
    parser.add_argument(staleness.FLAG, type=int, default=None, metavar="K",
                        help="vradix bounded staleness: keep the KV of the K epochs before the current one for "
                             "requests that accept it (custom_params.vradix_max_staleness, at most K; a request "
                             f"naming none gets K). Default 0: exact reuse only. Same as {staleness.ENV}.")
    parser.add_argument(FLAG, choices=identity.MODES, default=None,
                        help="vradix: how each epoch's global weight_id is chosen: auto (default: fingerprint on a "
                             "P/D role, nonce otherwise), nonce (no reuse across restarts), fingerprint (content hash "
                             "of the published weights, equal on every TP layout), declared (the publication's "
                             "weight_version label, which the publisher vouches is globally unique). "
                             f"Same as {identity.ENV}.")


def export_identity_flag(original, argv, *args, **kwargs):
    """AROUND server_args.prepare_server_args: export the flag as VRADIX_WEIGHT_IDENTITY before any scheduler process
    starts (they inherit the environment; ServerArgs has no field for it). An invalid value exits with argparse's
    usage error."""
    parser = argparse.ArgumentParser(prog="sglang serve", add_help=False)
    parser.add_argument(FLAG, choices=identity.MODES, default=None)
    parser.add_argument(staleness.FLAG, type=int, default=None)
    known, _ = parser.parse_known_args(argv)
    if known.vradix_weight_identity is not None:
        os.environ[identity.ENV] = known.vradix_weight_identity
    if known.vradix_max_staleness is not None:
        os.environ[staleness.ENV] = str(known.vradix_max_staleness)
    return original(argv, *args, **kwargs)


async def refuse_reused_declared_label(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND TokenizerControlMixin.update_weight_version: in `declared` identity mode a scheduler keeps its label when
    the new one reuses an identity an earlier publication declared (`publication.publish_on_version_change`; the
    scheduler has no failure reply for this call). Here that becomes an error (`/update_weight_version` answers HTTP
    400) and the launcher's own label is put back, so nothing changed anywhere."""
    from sglang.srt.runtime_context import get_serving

    if identity.mode_from_env() != "declared":
        return await original(tokenizer_manager, obj, *args, **kwargs)
    before = get_serving().weight_version
    result = await original(tokenizer_manager, obj, *args, **kwargs)
    labels = [(s or {}).get("vradix", {}).get("label") for s in await tokenizer_manager.get_internal_state()]
    if any(label != obj.new_version for label in labels):
        tokenizer_manager._update_weight_version_if_provided(before)
        raise identity.InvalidIdentityError(
            f"declared weight identity {obj.new_version!r} was already used by an earlier publication of this "
            f"engine; the label stays {before!r}")
    return result


def check_generate_request(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerManager._validate_one_request (per request, and per element of a batch; one hook for both
    launcher-side checks, raising errors SGLang's HTTP layer answers with HTTP 400 before the request reaches a
    scheduler): a `custom_params.vradix_max_staleness` that is not an integer from 0 to the server window
    (StalenessError), and, on a decode role, a request without bootstrap fields
    (`pd_launcher.reject_decode_request_without_bootstrap`)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if isinstance(obj, GenerateReqInput):
        staleness.check_request(obj, launcher_window())
        pd_launcher.reject_decode_request_without_bootstrap(tokenizer_manager, obj)


@functools.cache
def launcher_window() -> int:
    """The server window, read once in this (the launcher's) process: the flag is exported before any request
    (`export_identity_flag`), and a window never changes while the server runs."""
    return staleness.server_window()
