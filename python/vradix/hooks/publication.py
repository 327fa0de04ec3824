"""Publication hooks (data-path step 2, scheduler process): every way the weights (or their label) change is one publication
(`vradix.scheduler.publication.Publication`), which applies once (an epoch bump; without a radix cache, a drop of the
weight-derived caches). Each hook here only opens it, runs SGLang's change and closes it. The flush hook
(`lock_aware_flush`) hands a flush SGLang runs inside an open publication to it; a flush by itself is no publication:
the engine's own operation (`vradix.scheduler.flush`: an idle reset, or a lock-aware bump)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from vradix import collectives
from vradix.closed_world import post_load
from vradix.core import epochs, overlap
from vradix.scheduler.publication import Publication, engine_of, opened

logger = logging.getLogger("vradix")


def publish_after_version_record(original, updater, weight_version, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.record_weight_version_after_update: the success point of every
    update_weights_* call (weights changed, flush not yet run), handed to the open publication
    (`Publication.version_recorded`: it applies once per call outside a bucketed update, on a radix cache or without
    one, and not inside one); a record outside every update call vradix opened is a publication of its own."""
    result = original(updater, weight_version, *args, **kwargs)
    pub = Publication.open(updater.scheduler, "weight update", drain=False)
    if pub is not None:
        pub.version_recorded()
    return result


def publish_on_version_change(original, scheduler, new_version, *args, **kwargs):
    """AROUND Scheduler.record_weight_version_change: `/update_weight_version` alone is a publication
    (`Publication.relabel`); inside an update call or a bucketed update it only relabels."""
    pub = Publication.open(scheduler, "update_weight_version", drain=False)
    if pub is None or pub.is_open:
        return original(scheduler, new_version, *args, **kwargs)
    return pub.relabel(lambda: original(scheduler, new_version, *args, **kwargs), new_version)


def lock_aware_flush(original, scheduler, *args, **kwargs):
    """AROUND Scheduler.flush_cache: a flush inside an open publication is part of it (`Publication.flush`), never a
    second bump: the flush an update call asks for after its bump, a flush inside a bucketed update. A flush by
    itself is the engine's own operation (its `flush`: `vradix.scheduler.flush` on a versioned engine, an idle reset
    or, with KV holders present, a lock-aware bump instead of SGLang's refusal)."""
    def sglang_flush():
        return original(scheduler, *args, **kwargs)

    pub = opened(scheduler)
    if pub is not None:
        return pub.flush(sglang_flush)
    engine = engine_of(scheduler)
    return engine.flush(sglang_flush) if engine is not None else sglang_flush()


@dataclass(frozen=True)
class UpdatePath:
    """One `update_weights_*` path: its source name, SGLang's output type, whether its calls touch weights only
    inside a bucketed update, and the refusals it runs before loading (see `publish_update`)."""

    source: str
    output_type_name: str
    needs_bucketed_update: bool
    refuse_before_load: Optional[Callable] = None
    #: the request's own validation (it reads nothing but the request), run before every other refusal
    refuse_malformed: Optional[Callable] = None

    def refusals(self) -> tuple:
        return (refuse_gpu_derived_copies(self.source, self.output_type_name),) + (
            (self.refuse_before_load,) if self.refuse_before_load is not None else ())


def publish_update(path: UpdatePath, original, updater, recv_req, *args, **kwargs):
    """One `update_weights_*` call, as one publication (`vradix.scheduler.publication.Publication`).

    Invariants:
    - outside a bucketed update, one call is one publication: a success bumps exactly once (at
      `record_weight_version_after_update`; the flush SGLang runs afterwards never bumps again), and a returned
      failure that may have touched the weights bumps once, conservatively;
    - inside a bucketed update the call is one bucket: it applies its label and never bumps
      (`publish_on_bucketed_update_end` does);
    - the refusals return the failed response for a request SGLang would reject before touching any weight, or one
      that would leave a GPU-derived copy stale (`refuse_gpu_derived_copies`): such a request changes nothing and
      does not bump; on a radix cache a reused declared identity is refused first;
    - in `fingerprint` mode every tensor the call loads through the model's `load_weights` is recorded, so the bump
      proves the new weights' identity from what was published;
    - an exception raised by the update itself is never caught: once weights may have been touched, the engine stops
      exactly as stock SGLang does, rather than serve on weights nobody can name.
    """
    pub = Publication.open(updater.scheduler, path.source)
    if pub is None:
        return original(updater, recv_req, *args, **kwargs)
    refused = refusal(path, pub, updater, recv_req)
    if refused is not None:
        return pub.refuse(refused, path.source)
    with pub.running():
        out = original(updater, recv_req, *args, **kwargs)
    return pub.close_update(out, may_touch_weights=not path.needs_bucketed_update or updater._session is not None)


def refusal(path: UpdatePath, pub: Publication, updater, recv_req):
    """The failed response that refuses `recv_req` before loading, or None."""
    if path.refuse_malformed is not None:
        refused = path.refuse_malformed(recv_req)
        if refused is not None:
            return refused
    refused = refuse_reused_declaration(pub, getattr(recv_req, "weight_version", None),
                                        io_output_type(path.output_type_name))
    if refused is not None:
        return refused
    return first_refusal(path.refusals(), updater, recv_req)


def publish_update_from_disk(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.update_weights_from_disk: one publication (`publish_update`)."""
    return publish_update(FROM_DISK, original, updater, recv_req, *args, **kwargs)


def publish_update_from_distributed(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.update_weights_from_distributed: one publication (`publish_update`)."""
    return publish_update(FROM_DISTRIBUTED, original, updater, recv_req, *args, **kwargs)


def publish_update_from_tensor(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.update_weights_from_tensor: one publication (`publish_update`)."""
    return publish_update(FROM_TENSOR, original, updater, recv_req, *args, **kwargs)


def publish_update_from_ipc(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.update_weights_from_ipc: one publication (`publish_update`)."""
    return publish_update(FROM_IPC, original, updater, recv_req, *args, **kwargs)


def refuse_reused_declaration(pub: Publication, label, output_type):
    """In `declared` mode, a publication naming a declared identity an earlier publication of this engine already
    used (or an invalid declaration) is refused before any weight changes (the engine's `declaration_refusal`):
    returns the failed response, or None."""
    message = pub.engine.declaration_refusal(label)
    return None if message is None else output_type(success=False, message=message)


def first_refusal(refusals, updater, recv_req):
    """The failed response of the first of `refusals` that refuses `recv_req`, or None."""
    for refuse in refusals:
        refused = refuse(updater, recv_req)
        if refused is not None:
            return refused
    return None


def refuse_gpu_derived_copies(source: str, output_type_name: str):
    """The refusal of `source` (an update call, or begin_weight_update) when a model it would update holds a
    weight-derived copy the update would leave stale (`vradix.closed_world.post_load.gpu_derived_refusal`; at begin, also what
    SGLang's own check refuses at every update call). Returns SGLang's failed output for `source`, or None.

    Invariants: it reads the models of the runners the request selects and the graphs of every runner (a captured
    graph of the target stands for the draft's too); every rank of the TP group refuses together
    (`refused_on_any_rank`), so no rank loads while another refuses or waits at a barrier."""
    def refuse(updater, recv_req):
        selected = updater._select_runners(getattr(recv_req, "selector", "all"))
        models = [runner.model for _, runner in selected]
        graphs = any(post_load.captures_graphs(runner) for _, runner in updater._select_runners())
        reason = None
        if models:  # no model selected: no copy to leave stale
            reason = post_load.gpu_derived_refusal(source, models, graphs)
            if reason is None and source == post_load.BEGIN:
                reason = post_load.bypassed_sglang_refusal(models)
        group = getattr(updater, "tp_cpu_group", None)
        if group is not None:  # a single rank has no other rank to refuse with
            reason = refused_on_any_rank(source, reason, group)
        return None if reason is None else io_output_type(output_type_name)(success=False, message=reason)
    return refuse


def refused_on_any_rank(source: str, reason, group):
    """`reason`, or, when another rank of `group` refuses and this one does not, the reason it refuses too: a copy
    built at a first forward may exist on one rank only (a DP-attention rank that ran only idle batches)."""
    if collectives.on_any_rank(reason is not None, group) and reason is None:
        return (f"vradix refused {source}: another rank of this engine holds a weight-derived copy the update would "
                "leave stale (its log names it)")
    return reason


def io_output_type(name: str):
    from sglang.srt.managers import io_struct
    return getattr(io_struct, name)


def refuse_disk_update_before_load(updater, recv_req):
    """What stock SGLang raises or refuses before any weight changes, checked first so it cannot bump: the
    `LoadConfig` and the model loader SGLang builds for `recv_req.load_format` (an unknown format raises there), and
    the loader type (only `DefaultModelLoader` can update in place). Returns the failed response, or None."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput
    from sglang.srt.model_loader.loader import DefaultModelLoader, get_model_loader

    model_config = updater.tp_worker.model_runner.model_config
    try:
        loader = get_model_loader(LoadConfig(load_format=recv_req.load_format), model_config)
    except Exception as e:  # noqa: BLE001 - nothing is touched yet: a bad load_format is a failed request
        message = f"update_weights_from_disk refused: load_format {recv_req.load_format!r}: {type(e).__name__}: {e}"
    else:
        if isinstance(loader, DefaultModelLoader):
            return None
        message = (f"update_weights_from_disk refused: load_format {recv_req.load_format!r} gives "
                   f"{type(loader).__name__}, which cannot update weights in place")
    return UpdateWeightFromDiskReqOutput(success=False, message=message, num_paused_requests=0)


def refuse_malformed_disk_request(recv_req):
    """A malformed `/update_weights_from_disk` request (`core.epochs.check_disk_update_request`: a field of the
    wrong type, an empty model path, an unknown load format, an invalid label), refused where the scheduler receives
    it, before anything else reads it; the launcher refuses it first (`hooks.launcher`). Returns the failed
    response, or None."""
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput

    try:
        epochs.check_disk_update_request(recv_req)
    except (epochs.InvalidLabelError, epochs.InvalidUpdateRequest) as e:
        return UpdateWeightFromDiskReqOutput(success=False, message=f"vradix refused the update: {e}",
                                             num_paused_requests=0)
    return None


def refuse_tensor_update_before_load(updater, recv_req):
    """A `load_format="direct"` tensor update of a model that derives weights after loading is refused before any
    runner loads a tensor (`vradix.closed_world.post_load.direct_update_refusal`). Returns the failed response, or None."""
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqOutput

    if recv_req.load_format != "direct":
        return None
    models = [runner.model for _, runner in updater._select_runners(recv_req.selector)]
    reason = post_load.direct_update_refusal(recv_req.load_format, models)
    return None if reason is None else UpdateWeightsFromTensorReqOutput(success=False, message=reason)


def fail_ipc_update_on_post_hook_failure(original, weight_updater, recv_req, *args, **kwargs):
    """AROUND the model runner's WeightUpdater.update_weights_from_ipc: SGLang's IPC post-hook logs its own failure
    as a warning and the update reports success; such a call returns failure instead (`vradix.closed_world.post_load`), so the
    scheduler does not record its label and the update is not a publication of it (having touched the weights, it
    bumps once, conservatively, as every failed update that may have touched weights)."""
    with post_load.PostHookFailures() as failures:
        success, message = original(weight_updater, recv_req, *args, **kwargs)
    if success and failures.failures:
        return False, (f"vradix: update_weights_from_ipc failed: the weights were loaded but SGLang's post-load step "
                       f"failed ({failures.failures[0]}), so derived weights may be those of the old weights; its "
                       "label is not applied. Fix the cause and update again")
    return success, message


FROM_DISK = UpdatePath("update_weights_from_disk", "UpdateWeightFromDiskReqOutput", needs_bucketed_update=False,
                       refuse_before_load=refuse_disk_update_before_load,
                       refuse_malformed=refuse_malformed_disk_request)
FROM_DISTRIBUTED = UpdatePath("update_weights_from_distributed", "UpdateWeightsFromDistributedReqOutput",
                              needs_bucketed_update=True)
FROM_TENSOR = UpdatePath("update_weights_from_tensor", "UpdateWeightsFromTensorReqOutput", needs_bucketed_update=True,
                         refuse_before_load=refuse_tensor_update_before_load)
FROM_IPC = UpdatePath("update_weights_from_ipc", "UpdateWeightsFromIPCReqOutput", needs_bucketed_update=False)

refuse_bucketed_update_before_begin = refuse_gpu_derived_copies(post_load.BEGIN, "BeginWeightUpdateReqOutput")


def open_bucketed_update(original, updater, recv_req, *args, **kwargs):
    """AROUND begin_weight_update: nothing may be in flight when weights start to change (P2P/RDMA writes may start
    right after it), and a successful begin opens one publication that stays open until end_weight_update
    (`Publication.begin_bucketed`). The launcher has already paused generation in place
    (`launcher.hold_generation_for_bucketed_update`), and resumes it when the begin fails.

    A bucketed update on a model holding a copy its writes would leave stale is refused before SGLang opens it
    (`refuse_bucketed_update_before_begin`): no bucketed update, no bump, nothing restored."""
    scheduler = updater.scheduler
    pub = Publication.open(scheduler, post_load.BEGIN)
    refused = refuse_bucketed_update_before_begin(updater, recv_req) if pub is not None else None
    if refused is not None:
        logger.error("vradix: begin_weight_update refused: %s", refused.message)
        pub.engine.discard_drain()
        return refused
    out = original(updater, recv_req, *args, **kwargs)
    if pub is not None and out.success:
        pub.begin_bucketed()
    return out


def publish_on_bucketed_update_end(original, updater, recv_req, *args, **kwargs):
    """AROUND end_weight_update: the bucketed update was one publication, so it bumps exactly once here
    (`Publication.end_bucketed`), whatever the number of buckets (none: a P2P/RDMA write)."""
    out = original(updater, recv_req, *args, **kwargs)
    pub = opened(updater.scheduler)
    if pub is None or pub.bucketed is None or not out.success:
        return out
    return pub.end_bucketed(out)


def drain_before_in_place_pause(scheduler, recv_req, *args, **kwargs):
    """BEFORE Scheduler.pause_generation: an in_place pause first finishes the batch already launched."""
    if recv_req.mode == "in_place":
        overlap.drain_inflight_batch(scheduler)


def skip_drained_result(original, scheduler, batch, result, *args, **kwargs):
    """AROUND `Scheduler.process_batch_result`: a placeholder left by a drain was already processed."""
    if result is overlap.DRAINED:
        return None
    return original(scheduler, batch, result, *args, **kwargs)


def publish_weights_checker_reset(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.check_weights: the `reset_tensors` action overwrites every checked
    parameter with random values, so it is a publication (bumps once, success or not: it may have written some);
    `snapshot` and `compare` only read the weights and run unchanged."""
    if recv_req.action != "reset_tensors" or updater.scheduler is None:
        return original(updater, recv_req, *args, **kwargs)
    reason = "weights_checker reset_tensors"
    pub = Publication.open(updater.scheduler, reason)
    try:
        return original(updater, recv_req, *args, **kwargs)
    finally:
        logger.info(pub.write(reason) if pub is not None else f"vradix: {reason}")


def weights_restored_from_backup(updater) -> bool:
    """Whether resuming the weights' memory restores their contents: SGLang keeps a CPU backup of the target's (and
    the draft's) weights only with `--enable-weights-cpu-backup` (`--enable-draft-weights-cpu-backup`), and never in
    zero-copy IPC mode; without one, `resume_memory_occupation` remaps the memory without its contents."""
    from sglang.srt.runtime_context import get_exec, get_model

    features = get_exec().features
    draft_backed = updater.draft_worker is None or features.enable_draft_weights_cpu_backup
    return bool(features.enable_weights_cpu_backup and draft_backed and get_model().weight_cache_mode == "off")


def publish_weights_resumed_without_backup(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.resume_memory_occupation: resuming the `weights` tag (an empty tag list
    means every tag) without a CPU backup leaves weights nobody published in the model, so it is a publication: KV
    of the released weights is never matched again. With a backup the same weights come back: no publication."""
    from sglang.srt.constants import GPU_MEMORY_TYPE_WEIGHTS

    out = original(updater, recv_req, *args, **kwargs)
    tags = recv_req.tags or [GPU_MEMORY_TYPE_WEIGHTS]
    if updater.scheduler is not None and GPU_MEMORY_TYPE_WEIGHTS in tags and not weights_restored_from_backup(updater):
        reason = "weights resumed without a CPU backup"
        pub = Publication.open(updater.scheduler, reason, drain=False)
        logger.info(pub.write(reason) if pub is not None else f"vradix: {reason}")
    return out
