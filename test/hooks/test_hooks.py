"""Every hook in `vradix.hooks.HOOKS` runs in a test.

`DRIVEN_BY` names, for each hook body, the test that calls it. `test_every_hook_is_driven_by_a_named_test` fails
when a hook is added to HOOKS without an entry here, or when an entry names a test that does not exist or that only
`make test-long` runs, so a new hook without a CI test fails CI. This file also drives the LoRA hooks through their
real functions, on SGLang's real UnifiedRadixCache with real `LoadLoRAAdapterReqInput` / `UnloadLoRAAdapterReqInput` /
`LoRAUpdateOutput` messages.
"""
import sys
import types

import pytest
from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput, LoRAUpdateOutput, UnloadLoRAAdapterReqInput

from vradix.core import lora
from vradix.hooks import HOOKS
from vradix.hooks import lora as lora_hooks
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache
from vradix.testing.harness.suite import find_test_file, functions_in, is_long_test
from vradix.testing.models.llama import generate_lora, load_lora_adapter

#: hook body (module.function) -> "test_file.py::test_name" that runs it
DRIVEN_BY = {
    "vradix.hooks.launcher.check_generate_request": "test_staleness.py::test_a_bound_above_the_window_is_refused_with_a_400_error",
    "vradix.hooks.launcher.add_identity_flag": "test_identity.py::test_server_flag_sets_the_mode_for_scheduler_processes",
    "vradix.hooks.launcher.refuse_reused_declared_label": "test_e2e_identity.py::test_a_reused_declaration_is_refused_on_every_path_and_changes_nothing",
    "vradix.hooks.launcher.export_identity_flag": "test_identity.py::test_server_flag_sets_the_mode_for_scheduler_processes",
    "vradix.hooks.tokenizer_worker.name_vradix_worker_app": "test_tokenizer_workers.py::test_every_tokenizer_worker_installs_vradix",
    "vradix.hooks.tokenizer_worker.load_vradix_where_launch_data_is_read": "test_tokenizer_workers.py::test_every_tokenizer_worker_installs_vradix",
    "vradix.hooks.ray_actor.load_vradix_in_scheduler_actor": "test_ray_actor.py::test_a_ray_scheduler_actor_serves_with_vradix_and_a_publication_is_verified",
    "vradix.hooks.startup.tap_startup_load": "test_publication_hooks.py::test_fingerprint_mode_proves_equal_weights_and_tells_different_ones_apart",
    "vradix.hooks.startup.refuse_unversioned_launch": "test_coverage.py::test_a_refused_flag_stops_the_engine_start_too",
    "vradix.hooks.control.refuse_requests_inside_held_bucketed_update": "test_scheduler_refusals.py::test_a_bucketed_update_the_launcher_did_not_hold_pauses_the_scheduler_and_refuses_new_requests",
    "vradix.hooks.serving.accept_generate": "test_scheduler_refusals.py::test_a_decode_request_without_bootstrap_fields_is_refused_by_the_decode_scheduler",
    "vradix.hooks.startup.attach_to_scheduler": "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
    "vradix.hooks.startup.refuse_encoder_server": "test_weight_derived.py::test_an_encoder_only_server_does_not_build_its_encoder",
    "vradix.hooks.publication.fail_ipc_update_on_post_hook_failure": "test_weight_derived.py::test_an_ipc_update_whose_post_hook_failed_is_not_published",
    "vradix.hooks.admission.verify_load_back": "test_hicache_ledger.py::test_a_host_copy_of_an_older_epoch_is_not_loaded_for_a_newer_request",
    "vradix.hooks.prefill.hold_back_duplicate_prefill": "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
    "vradix.hooks.serving.admit": "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
    "vradix.hooks.serving.before_match": "test_cache_level.py::test_lazy_rebind_at_match_covers_requests_the_bump_did_not_see",
    "vradix.hooks.serving.release": "test_cache_level.py::test_crossing_request_keeps_its_kv_and_frees_stale_path_at_release",
    "vradix.hooks.serving.prefill_pass": "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
    "vradix.hooks.serving.before_forward": "test_backstop.py::test_a_session_record_lent_across_a_publication_fails_the_next_turn",
    "vradix.hooks.serving.at_result":
        "test_hot_path_sync.py::test_an_extend_batch_reads_nothing_of_the_ledger_before_its_result",
    "vradix.hooks.ledger.hold_stash_until_verdict":
        "test_hot_path_sync.py::test_the_overlap_loop_holds_a_chunk_checkpoint_until_its_verdict_is_read",
    "vradix.hooks.ledger.on_free_slots": "test_ledger.py::test_ledger_follows_writes_frees_and_epochs",
    "vradix.hooks.ledger.on_free_pages": "test_ledger.py::test_ledger_follows_writes_frees_and_epochs",
    "vradix.hooks.ledger.on_clear": "test_model_based.py::test_versioned_cache_state_machine",
    "vradix.hooks.hicache.carry_epochs_to_host": "test_hicache_ledger.py::test_load_back_carries_the_epoch_of_the_host_copy_and_the_strict_guard_verifies_it",
    "vradix.hooks.hicache.carry_epochs_to_device": "test_hicache_ledger.py::test_load_back_carries_the_epoch_of_the_host_copy_and_the_strict_guard_verifies_it",
    "vradix.hooks.hicache.stamp_prefetched_pages": "test_hicache_ledger.py::test_pages_prefetched_from_storage_carry_their_key_epoch_through_load_back",
    "vradix.hooks.publication.publish_update_from_disk": "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
    "vradix.hooks.publication.publish_update_from_distributed": "test_publication_hooks.py::test_distributed_buckets_in_a_bucketed_update_are_one_publication",
    "vradix.hooks.publication.publish_update_from_tensor": "test_bucketed_updates.py::test_a_bucketed_update_is_one_publication_with_requests_in_flight",
    "vradix.hooks.publication.publish_update_from_ipc": "test_publication_hooks.py::test_an_ipc_update_outside_a_bucketed_update_is_one_publication",
    "vradix.hooks.publication.publish_after_version_record": "test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix",
    "vradix.hooks.publication.open_bucketed_update": "test_bucketed_updates.py::test_a_bucketed_update_is_one_publication_with_requests_in_flight",
    "vradix.hooks.publication.publish_weights_checker_reset": "test_control_requests.py::test_a_weights_checker_reset_is_a_publication",
    "vradix.hooks.publication.publish_weights_resumed_without_backup": "test_control_requests.py::test_resuming_weights_without_a_cpu_backup_is_a_publication",
    "vradix.hooks.control.refuse_continue_inside_bucketed_update": "test_control_requests.py::test_the_scheduler_keeps_generation_paused_inside_a_bucketed_update",
    "vradix.hooks.control.refuse_state_changing_rpc": "test_control_requests.py::test_an_rpc_to_a_method_that_changes_state_is_refused",
    "vradix.hooks.launcher.refuse_continue_inside_bucketed_update": "test_control_requests.py::test_continue_generation_inside_a_bucketed_update_is_refused",
    "vradix.hooks.launcher.refuse_relaxed_speculative_acceptance": "test_control_requests.py::test_relaxing_speculative_acceptance_at_runtime_is_refused",
    "vradix.hooks.publication.publish_on_bucketed_update_end": "test_bucketed_updates.py::test_a_bucketed_update_without_buckets_bumps_once_and_an_explicit_pause_stays",
    "vradix.hooks.launcher.hold_generation_for_bucketed_update": "test_bucketed_updates.py::test_a_bucketed_update_is_one_publication_with_requests_in_flight",
    "vradix.hooks.launcher.release_generation_after_bucketed_update": "test_bucketed_updates.py::test_a_bucketed_update_without_buckets_bumps_once_and_an_explicit_pause_stays",
    "vradix.hooks.publication.publish_on_version_change": "test_e2e_server.py::test_lock_aware_flush_and_update_weight_version",
    "vradix.hooks.publication.lock_aware_flush": "test_model_based.py::test_versioned_cache_state_machine",
    "vradix.hooks.launcher.reject_bad_version_label": "test_fault_injection.py::test_bad_version_labels_are_refused_and_change_nothing",
    "vradix.hooks.launcher.refuse_unversioned_paths_at_startup": "test_coverage.py::test_a_refused_flag_stops_the_launch",
    "vradix.hooks.pd_launcher.refuse_unsafe_restore_policy_at_startup": "test_pd_rules.py::test_a_decode_role_with_l3_starts_only_with_wait_complete",
    "vradix.hooks.pd_launcher.refuse_unmatchable_identity_at_startup": "test_pd_rules.py::test_a_pd_role_starts_only_with_an_identity_both_roles_share",
    "vradix.hooks.pd_launcher.refuse_unsafe_restore_policy_at_attach": "test_pd_rules.py::test_a_runtime_attach_with_another_policy_is_refused_before_any_scheduler",
    "vradix.hooks.pd.send_prefill_identity": "test_e2e_pd.py::test_skew_with_decode_updated_first_fails_the_request_and_caches_nothing",
    "vradix.hooks.ledger.backstop_prebuilt_batch": "test_pd_ledger.py::test_stale_kv_in_front_of_a_decode_requests_first_read_fails_it_and_inserts_nothing",
    "vradix.hooks.pd.keep_epochs_of_cpu_backup": "test_pd_retraction.py::test_a_restored_backup_keeps_its_epochs_in_the_ledger",
    "vradix.hooks.pd.stamp_restored_cpu_backup": "test_pd_retraction.py::test_a_restored_backup_keeps_its_epochs_in_the_ledger",
    "vradix.hooks.pd.keep_epochs_of_host_backup": "test_pd_retraction.py::test_a_restored_host_pool_backup_keeps_its_epochs_in_the_ledger",
    "vradix.hooks.pd.stamp_restored_host_backup": "test_pd_retraction.py::test_a_restored_host_pool_backup_keeps_its_epochs_in_the_ledger",
    "vradix.hooks.pd.check_prefill_identity": "test_e2e_pd.py::test_skew_with_decode_updated_first_fails_the_request_and_caches_nothing",
    "vradix.hooks.pd.restore_into_node_slots_only": "test_hybrid_hicache_cpu.py::test_a_restored_prefix_state_lands_in_its_node_slot_and_the_live_state_stays",
    "vradix.hooks.pd.answer_decode_failures_with_their_cause": "test_publication_hooks.py::test_a_decode_publication_revokes_unfulfilled_promises_crosses_fulfilled_ones_and_rebinds_the_waiting",
    "vradix.hooks.launcher.reject_bad_update_request": "test_bucketed_updates.py::test_malformed_disk_updates_are_refused_and_change_nothing",
    "vradix.hooks.publication.drain_before_in_place_pause": "test_fault_injection.py::test_abort_of_requests_paused_in_place",
    "vradix.hooks.publication.skip_drained_result": "test_e2e_server.py::test_overlap_batch_in_flight_at_pause_is_labelled_with_its_weights",
    "vradix.hooks.storage.discard_stale_prefetch": "test_l3.py::test_the_landing_guard_discards_a_prefetch_the_publication_did_not_revoke",
    "vradix.hooks.storage.record_storage_backup": "test_l3.py::test_each_stored_page_is_attributed_to_its_identity_and_gc_deletes_only_dead_ones",
    "vradix.hooks.storage.never_offload_crossing_kv": "test_pd_decode_offload.py::test_a_request_that_crossed_a_publication_offloads_none_of_its_mixed_kv",
    "vradix.hooks.storage.record_decode_offload": "test_pd_decode_offload.py::test_every_page_decode_offloads_is_in_the_manifest_under_its_identity",
    "vradix.hooks.reclaim.reclaim_stale_first": "test_deferred_reclaim.py::test_an_allocation_that_needs_memory_frees_stale_kv_first",
    "vradix.hooks.reclaim.reclaim_slice": "test_deferred_reclaim.py::test_slices_are_bounded_evict_only_stale_kv_and_end_with_the_pool_whole",
    "vradix.hooks.reclaim.finish_reclaim_when_idle": "test_deferred_reclaim.py::test_a_publication_mid_reclaim_and_a_crossing_release_keep_the_accounting_exact",
    "vradix.hooks.server_info.report_flush": "test_e2e_provenance.py::test_server_info_metrics_and_flush_report",
    "vradix.hooks.server_info.report_server_info": "test_e2e_provenance.py::test_server_info_metrics_and_flush_report",
    "vradix.hooks.server_info.attach_provenance": "test_e2e_provenance.py::test_provenance_in_meta_info_across_two_publications",
    "vradix.hooks.report.provenance_to_meta_info": "test_e2e_provenance.py::test_provenance_in_meta_info_across_two_publications",
    "vradix.hooks.report.provenance_to_openai_metadata": "test_e2e_provenance.py::test_provenance_in_meta_info_across_two_publications",
    "vradix.hooks.report.remember_flush_message": "test_e2e_provenance.py::test_server_info_metrics_and_flush_report",
    "vradix.hooks.report.add_flush_report_middleware": "test_e2e_provenance.py::test_server_info_metrics_and_flush_report",
    "vradix.hooks.inspector.answer_cache_inspection": "test_e2e_provenance.py::test_cache_inspector_after_a_publication_and_refused_without_vradix",
    "vradix.hooks.report.add_cache_inspector_endpoint": "test_e2e_provenance.py::test_cache_inspector_after_a_publication_and_refused_without_vradix",
    "vradix.hooks.lora.identify_loaded_adapter": "test_hooks.py::test_adapter_load_insert_and_unload_hooks",
    "vradix.hooks.lora.free_unloaded_adapter": "test_hooks.py::test_adapter_load_insert_and_unload_hooks",
    "vradix.hooks.reconfigure.recheck_storage_attach":
        "test_reconfigure.py::test_a_runtime_attach_the_launch_refuses_is_refused_by_the_scheduler_and_changes_nothing",
    "vradix.hooks.reconfigure.rederive_after_storage_detach":
        "test_reconfigure.py::test_a_storage_attached_at_runtime_makes_the_next_publication_revoke_queued_prefetches",
    "vradix.hooks.reconfigure.recheck_internal_state":
        "test_reconfigure.py::test_relaxed_speculative_acceptance_is_refused_by_the_scheduler_without_the_launcher",
}


#: hooks no test drives yet: each needs a real SchedulerWeightUpdaterManager with a CPU
#: tp_worker and a one-rank gloo TP group. Only shrink this set; a hook added to HOOKS cannot be listed here.
#: hooks that no test drives yet (must stay empty; kept so a gap is named, not hidden)
NOT_YET_DRIVEN: set = set()


def hook_name(fn) -> str:
    """`module.name` under which the hook's module exports it (built handlers carry another `__name__`)."""
    module = sys.modules[fn.__module__]
    (name,) = [k for k, v in vars(module).items() if v is fn]
    return f"{fn.__module__}.{name}"


def test_every_hook_is_driven_by_a_named_test():
    hooks = {hook_name(fn) for _, _, fn in HOOKS}
    assert hooks - DRIVEN_BY.keys() == set(), "hooks in HOOKS with no test named in DRIVEN_BY"
    assert DRIVEN_BY.keys() - hooks == set(), "DRIVEN_BY names hooks that are not in HOOKS"
    assert all(not DRIVEN_BY[h] for h in NOT_YET_DRIVEN), "a hook now has a test: remove it from NOT_YET_DRIVEN"
    missing = []
    for hook, where in sorted(DRIVEN_BY.items()):
        if hook in NOT_YET_DRIVEN:
            continue
        file, _, name = where.partition("::")
        path = find_test_file(file)
        if not name or path is None or name not in functions_in(path):
            missing.append(f"{hook}: {where or '(no test)'}")
        elif is_long_test(where):
            missing.append(f"{hook}: {where} is `long`, so `make test` (CI) does not drive the hook")
    assert not missing, "hooks whose named test does not exist or runs only in make test-long:\n" + "\n".join(missing)


# ---- LoRA hooks, through their real functions ------------------------------------------------------------------------
@pytest.mark.parametrize("core,page_size", [("rust", 1), ("python", 16)])
def test_adapter_load_insert_and_unload_hooks(core, page_size, tmp_path):
    fx = build_cache(core, page_size, kv_tokens=2048)
    state = attach(fx.cache)
    scheduler = fx.scheduler_view()
    path = generate_lora(str(tmp_path / "X"), seed=1)
    adapter = load_lora_adapter(path, "X-1")  # SGLang's own LoRAAdapter, where its scheduler holds it
    scheduler.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
        lora_manager=types.SimpleNamespace(loras={"X-1": adapter})))
    P = list(range(700, 748))
    load = LoadLoRAAdapterReqInput(lora_name="X", lora_path=path, lora_id="X-1")
    lora_hooks.identify_loaded_adapter(LoRAUpdateOutput(success=False, error_message="bad"), scheduler, load)
    assert state.lora.events == 0 and not state.lora.adapter_ids  # a failed load minted no namespace
    lora_hooks.identify_loaded_adapter(LoRAUpdateOutput(success=True), scheduler, load)
    assert state.lora.events == 1 and state.lora.adapter_ids == {"X-1": lora.content_identity(adapter)}
    for lora_id, last in (("X-1", 1), ("X-1", 2), (None, 3)):
        r = fx.make_req(P + [last], lora_id=lora_id)
        state.admit_or_raise(r)
        fx.admit(r)
        fx.prefill(r)
        fx.finish(r)
    cached = fx.cache.evictable_size()
    unload = UnloadLoRAAdapterReqInput(lora_name="X", lora_id="X-1")
    lora_hooks.free_unloaded_adapter(LoRAUpdateOutput(success=False), scheduler, unload)
    assert fx.cache.evictable_size() == cached  # a failed unload frees nothing
    lora_hooks.free_unloaded_adapter(LoRAUpdateOutput(success=True), scheduler, unload)
    assert state.lora.events == 2 and "X-1" not in state.lora.adapter_ids
    assert 0 < state.lora.tokens_freed == cached - fx.cache.evictable_size()
    base = fx.make_req(P + [4])
    state.admit_or_raise(base)
    assert fx.admit(base) == len(P) // page_size * page_size  # the base model's entries are untouched
    fx.prefill(base)
    fx.finish(base)


#: where an SGLang target runs: the launcher process (HTTP server, TokenizerManager, argument parsing, the Ray actor
#: launch); every other target runs in a scheduler process
LAUNCHER_TARGETS = ("sglang.srt.entrypoints.http_server.", "sglang.srt.managers.tokenizer_manager.",
                    "sglang.srt.managers.tokenizer_control_mixin.", "sglang.srt.managers.multi_tokenizer_mixin.",
                    "sglang.srt.server_args.", "sglang.srt.utils.weight_versions.", "sglang.srt.ray.")


def process_of_target(target: str) -> str:
    return "launcher" if target.startswith(LAUNCHER_TARGETS) else "scheduler"


def process_of_module(module) -> str:
    """The process a hook module's docstring names on its first line: "(scheduler process" or "(launcher process"."""
    first = (module.__doc__ or "").splitlines()[0]
    named = [p for p in ("scheduler", "launcher") if f"{p} process" in first]
    assert len(named) == 1, f"{module.__name__}'s first docstring line names no single process: {first!r}"
    return named[0]


def test_each_hook_module_runs_in_the_one_process_its_docstring_names():
    """The hooks are split by the process they run in: every hook of a module attaches to a target of the process
    its docstring names."""
    import sys

    from vradix.hooks import HOOKS
    wrong = [f"{f.__module__}.{f.__name__} on {target} ({process_of_target(target)})" for target, _kind, f in HOOKS
             if process_of_target(target) != process_of_module(sys.modules[f.__module__])]
    assert not wrong, wrong
