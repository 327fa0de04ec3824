"""Engine start under Ray (launcher process): SGLang's Ray scheduler actor loads vradix before it builds its Scheduler.

`sglang.srt.ray` runs each scheduler in a `SchedulerActor` (`ray/scheduler_actor.py`) instead of
`run_scheduler_process`, and that actor never calls `load_plugins()`: without this hook its Scheduler would serve an
unversioned radix cache. Every actor SGLang creates goes through `SchedulerActor.options(...)`
(`ray/engine.py::_create_scheduler_actor`, also for the DP controller), so this hook gives each one a Ray
worker setup hook, which the actor's worker process runs before the actor exists:
`vradix.plugin.load_in_ray_scheduler_worker` loads the plugins there and refuses (the actor fails to start, with an
error naming vradix) unless vradix installed.

The target lives in a module that imports Ray, so the plugin installs this hook when that module is first imported
(`vradix.hooks.DEFERRED_MODULES`): engines that never use Ray never import it.
"""
from __future__ import annotations

from vradix.settings import RAY_CHAINED_SETUP_HOOK_ENV, RAY_SETUP_HOOK


def load_vradix_in_scheduler_actor(options, **actor_options):
    """AROUND SchedulerActor.options: the actor's worker process runs vradix's setup hook first. A setup hook the
    actor would otherwise have run (the job's) is not lost: vradix's runs it after loading the plugins."""
    setup_env = setup_hook_env_var()
    runtime_env = dict(actor_options.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    chained = env_vars.get(setup_env) or inherited_env_vars().get(setup_env)
    env_vars[setup_env] = RAY_SETUP_HOOK
    if chained and chained != RAY_SETUP_HOOK:
        env_vars[RAY_CHAINED_SETUP_HOOK_ENV] = chained
    return options(**{**actor_options, "runtime_env": {**runtime_env, "env_vars": env_vars}})


def setup_hook_env_var() -> str:
    """Where a Ray worker process finds its `worker_process_setup_hook`. Ray honours the `runtime_env` field only for
    a job (`ray.init`), which it turns into this variable; an actor's runtime_env can set the variable itself."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    return WORKER_PROCESS_SETUP_HOOK_ENV_VAR


def inherited_env_vars() -> dict:
    """The env_vars of the runtime env the actor inherits (the job's, or the creating actor's)."""
    import ray

    if not ray.is_initialized():
        return {}
    return (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
