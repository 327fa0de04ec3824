"""Step 2 hooks (scheduler process): every way the weights (or their label) change bumps the epoch once."""
from __future__ import annotations

import logging

from vradix.closed_world import post_load
from vradix.core import overlap
from vradix.core.state import UpdateScope, WeightSession, state_of, state_of_scheduler, treeless_of
from vradix.scheduler.publication import (bump_scheduler, current_label, discard_drain, drain_for_publication,
                                         publish_without_tree, refuse_reused_declaration, tapping_publication)

logger = logging.getLogger("vradix")


def publish_after_version_record(original, updater, weight_version, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.record_weight_version_after_update: the success point of every
    update_weights_* call (weights changed, flush not yet run). Outside a weight-update session it bumps exactly once
    per update call; inside one it only applies the label (the session's end bumps, once)."""
    result = original(updater, weight_version, *args, **kwargs)
    scheduler = updater.scheduler
    state = state_of_scheduler(scheduler)
    if state is not None and state.session is None:
        scope = state.update_scope
        inv = bump_scheduler(scheduler, reason=scope.source if scope else "weight update", label=current_label())
        if scope is not None:
            scope.bumped = inv
    return result


def publish_on_version_change(original, scheduler, new_version, *args, **kwargs):
    """AROUND Scheduler.record_weight_version_change: `/update_weight_version` alone is a publication; inside a
    weight-update session it only relabels (the session's end bumps)."""
    state = state_of(scheduler.tree_cache)
    if state is None:
        return relabel_without_tree(original, scheduler, new_version, *args, **kwargs)
    if state.update_scope is not None or state.session is not None:
        return original(scheduler, new_version, *args, **kwargs)
    if state.identity_mode == "declared" and new_version is not None and new_version != state.label \
            and state.declared_before(new_version):
        # /update_weight_version has no failure reply: the launcher refuses this first (launcher.py); keep the label
        logger.error("vradix: refused label %r: declared identity already used by an earlier publication",
                     new_version)
        return None
    before = current_label()
    drain_for_publication(scheduler)
    result = original(scheduler, new_version, *args, **kwargs)
    if new_version is not None and new_version != before:
        bump_scheduler(scheduler, reason="update_weight_version", label=current_label(), weights_changed=False)
    else:
        discard_drain(state)  # the same label again: no publication
    return result


def relabel_without_tree(original, scheduler, new_version, *args, **kwargs):
    """`publish_on_version_change` on an engine without a radix cache: a new label outside an update call and a
    session is one publication."""
    treeless = treeless_of(scheduler.tree_cache)
    if treeless is None or treeless.update_in_progress is not None or treeless.session_open:
        return original(scheduler, new_version, *args, **kwargs)
    before = current_label()
    result = original(scheduler, new_version, *args, **kwargs)
    if new_version is not None and new_version != before:
        publish_without_tree(scheduler, "update_weight_version")
    return result


def _update_handler(source: str, output_type_name: str, needs_session: bool, refuse_before_load=None):
    """The AROUND hook of one `update_weights_*` path.

    Invariants:
    - outside a weight-update session, one call is one publication: a success bumps exactly once (at
      `record_weight_version_after_update`; the flush SGLang runs afterwards never bumps again), and a returned
      failure that may have touched the weights bumps once, conservatively;
    - inside a session the call is one bucket: it applies its label and never bumps (`publish_on_session_end` does);
    - `refuse_before_load(updater, recv_req)` returns the failed response for a request SGLang would reject before
      touching any weight, or None: such a request changes nothing and does not bump; before it, every source
      refuses an update that would leave a GPU-derived copy stale (`refuse_gpu_derived_copies`), the same way;
    - in `fingerprint` mode every tensor the call loads through the model's `load_weights` is recorded, so the bump
      proves the new weights' identity from what was published (`scheduler.publication.tapping_publication`);
    - an exception raised by the update itself is never caught: once weights may have been touched, the engine stops
      exactly as stock SGLang does, rather than serve on weights nobody can name.
    """
    refusals = (refuse_gpu_derived_copies(source, output_type_name),) + (
        (refuse_before_load,) if refuse_before_load is not None else ())

    def around_update(original, updater, recv_req, *args, **kwargs):
        scheduler = updater.scheduler
        drain_for_publication(scheduler)
        state = state_of_scheduler(scheduler)
        if state is None:
            if scheduler is None or treeless_of(scheduler.tree_cache) is None:
                return original(updater, recv_req, *args, **kwargs)
            return update_without_tree(original, updater, recv_req, *args, **kwargs)
        refused = refuse_reused_declaration(state, getattr(recv_req, "weight_version", None),
                                            io_output_type(output_type_name))
        if refused is None:
            refused = first_refusal(refusals, updater, recv_req)
        if refused is not None:
            logger.error("vradix: %s refused before loading: %s", source, refused.message)
            if state.session is None:
                discard_drain(state)
            return refused
        may_touch_weights = not needs_session or updater._session is not None
        scope = state.enter_update(UpdateScope(source=source, in_session=state.session is not None))
        try:
            with tapping_publication(scheduler, state):
                out = original(updater, recv_req, *args, **kwargs)
        finally:
            state.leave_update()
        if scope.in_session:
            return record_bucket(state.session, out)
        if scope.bumped is None and may_touch_weights and not out.success:
            scope.bumped = bump_scheduler(scheduler, reason=f"failed {source} (conservative)", label=current_label())
        if scope.bumped is not None:
            out.message = f"{out.message} [{scope.bumped.summary()}]"
        return out

    def update_without_tree(original, updater, recv_req, *args, **kwargs):
        """The same call on an engine without a radix cache (`state.TreelessState`): the same refusals before
        loading and the same publication count, with no tree; each publication drops the weight-derived caches."""
        scheduler, treeless = updater.scheduler, treeless_of(updater.scheduler.tree_cache)
        refused = first_refusal(refusals, updater, recv_req)
        if refused is not None:
            logger.error("vradix: %s refused before loading: %s", source, refused.message)
            return refused
        may_touch_weights = not needs_session or updater._session is not None
        treeless.update_in_progress = source
        try:
            out = original(updater, recv_req, *args, **kwargs)
        finally:
            treeless.update_in_progress = None
        if treeless.session_open or not (out.success or may_touch_weights):
            return out
        reason = source if out.success else f"failed {source} (conservative)"
        cleared = publish_without_tree(scheduler, reason)
        out.message = (f"{out.message} [vradix: {reason} without a radix cache: "
                       f"{cleared['mm_embeddings_cleared']} multimodal embedding(s), "
                       f"{cleared['position_grids_cleared']} position grid(s) cleared]")
        return out

    around_update.__name__ = f"publish_{source}"
    return around_update


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
        reason = post_load.gpu_derived_refusal(source, models, graphs)
        if reason is None and source == post_load.BEGIN:
            reason = post_load.bypassed_sglang_refusal(models)
        reason = refused_on_any_rank(source, reason, getattr(updater, "tp_cpu_group", None))
        return None if reason is None else io_output_type(output_type_name)(success=False, message=reason)
    return refuse


def refused_on_any_rank(source: str, reason, group):
    """`reason`, or, when another rank of `group` refuses and this one does not, the reason it refuses too: a copy
    built at a first forward may exist on one rank only (a DP-attention rank that ran only idle batches)."""
    import torch
    import torch.distributed as dist

    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return reason
    flag = torch.tensor([int(reason is not None)], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if flag.item() and reason is None:
        return (f"vradix refused {source}: another rank of this engine holds a weight-derived copy the update would "
                "leave stale (its log names it)")
    return reason


def io_output_type(name: str):
    from sglang.srt.managers import io_struct
    return getattr(io_struct, name)


def record_bucket(session, out):
    """Count one update call of an open session and say, in its response, that the bump waits for the session end."""
    session.count_bucket(failed=not out.success)
    out.message = (f"{out.message} [vradix: bucket {session.buckets} of a weight-update session; the epoch bumps once "
                   "at end_weight_update]")
    return out


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


publish_update_from_disk = _update_handler("update_weights_from_disk", "UpdateWeightFromDiskReqOutput",
                                           needs_session=False, refuse_before_load=refuse_disk_update_before_load)
publish_update_from_distributed = _update_handler("update_weights_from_distributed",
                                                  "UpdateWeightsFromDistributedReqOutput", needs_session=True)
publish_update_from_tensor = _update_handler("update_weights_from_tensor", "UpdateWeightsFromTensorReqOutput",
                                             needs_session=True, refuse_before_load=refuse_tensor_update_before_load)
publish_update_from_ipc = _update_handler("update_weights_from_ipc", "UpdateWeightsFromIPCReqOutput",
                                          needs_session=False)


refuse_session_before_begin = refuse_gpu_derived_copies(post_load.BEGIN, "BeginWeightUpdateReqOutput")


def open_weight_session(original, updater, recv_req, *args, **kwargs):
    """AROUND begin_weight_update: nothing may be in flight when weights start to change (P2P/RDMA writes may start
    right after it), and a successful begin opens one publication (`state.session`). The launcher has already paused
    generation in place (`launcher.hold_generation_for_session`), and resumes it when the begin fails.

    A session on a model holding a copy its writes would leave stale is refused before SGLang opens it
    (`refuse_session_before_begin`): no session, no bump, nothing restored."""
    scheduler = updater.scheduler
    if scheduler is not None:
        drain_for_publication(scheduler)
        attached = state_of(scheduler.tree_cache) is not None or treeless_of(scheduler.tree_cache) is not None
        refused = refuse_session_before_begin(updater, recv_req) if attached else None
        if refused is not None:
            logger.error("vradix: begin_weight_update refused: %s", refused.message)
            discard_drain(state_of_scheduler(scheduler))
            return refused
    out = original(updater, recv_req, *args, **kwargs)
    state = state_of_scheduler(scheduler)
    if state is not None and out.success:
        state.open_session(WeightSession())
    treeless = treeless_of(scheduler.tree_cache) if scheduler is not None else None
    if treeless is not None and out.success:
        treeless.session_open = True
    return out


def publish_on_session_end(original, updater, recv_req, *args, **kwargs):
    """AROUND end_weight_update: the session was one publication, so it bumps exactly once here, with the last label
    a bucket applied, whatever the number of buckets (none: a P2P/RDMA write)."""
    out = original(updater, recv_req, *args, **kwargs)
    scheduler = updater.scheduler
    state = state_of_scheduler(scheduler)
    treeless = treeless_of(scheduler.tree_cache) if scheduler is not None and state is None else None
    if treeless is not None and out.success and treeless.session_open:
        treeless.session_open = False
        publish_without_tree(scheduler, "weight-update session")
        return out
    if state is None or not out.success or state.session is None:
        return out
    session = state.close_session()
    how = (f"{session.buckets} bucket(s), {session.failed_buckets} failed" if session.buckets
           else "no bucket: P2P/RDMA")
    inv = bump_scheduler(scheduler, reason=f"weight-update session ({how})", label=current_label())
    out.message = f"{out.message} [{inv.summary()}]"
    return out


def drain_before_in_place_pause(scheduler, recv_req, *args, **kwargs):
    """BEFORE Scheduler.pause_generation: an in_place pause first finishes the batch already launched."""
    if recv_req.mode == "in_place":
        overlap.drain_inflight_batch(scheduler)


def skip_drained_result(original, scheduler, batch, result, *args, **kwargs):
    """AROUND `Scheduler.process_batch_result`: a placeholder left by a drain was already processed."""
    if result is overlap.DRAINED:
        return None
    return original(scheduler, batch, result, *args, **kwargs)


def publish_weight_write(scheduler, reason: str) -> str:
    """One publication for a control request that writes the weights outside every `update_weights_*` call. Inside
    an open weight-update session it is one more write of that session (its end bumps, once). Returns what was done,
    for the log and the response."""
    state = state_of_scheduler(scheduler)
    if state is not None:
        if state.session is not None:
            return f"vradix: {reason} inside a weight-update session; the epoch bumps at end_weight_update"
        return bump_scheduler(scheduler, reason=reason, label=current_label()).summary()
    treeless = treeless_of(scheduler.tree_cache)
    if treeless is None or treeless.session_open:
        return f"vradix: {reason}"
    publish_without_tree(scheduler, reason)
    return f"vradix: {reason} without a radix cache: weight-derived caches dropped"


def publish_weights_checker_reset(original, updater, recv_req, *args, **kwargs):
    """AROUND SchedulerWeightUpdaterManager.check_weights: the `reset_tensors` action overwrites every checked
    parameter with random values, so it is a publication (bumps once, success or not: it may have written some);
    `snapshot` and `compare` only read the weights and run unchanged."""
    if recv_req.action != "reset_tensors" or updater.scheduler is None:
        return original(updater, recv_req, *args, **kwargs)
    drain_for_publication(updater.scheduler)
    try:
        return original(updater, recv_req, *args, **kwargs)
    finally:
        logger.info(publish_weight_write(updater.scheduler, "weights_checker reset_tensors"))


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
        logger.info(publish_weight_write(updater.scheduler, "weights resumed without a CPU backup"))
    return out
