"""vradix's settings: the names of the environment variables and constants the processes of one engine share.

Standard library only: the plugin's entry point imports it before anything else."""
from __future__ import annotations

#: Ray's `worker_process_setup_hook` for SGLang's scheduler actors, and where it finds the setup hook it replaced
RAY_SETUP_HOOK = "vradix.plugin.load_in_ray_scheduler_worker"
RAY_CHAINED_SETUP_HOOK_ENV = "VRADIX_RAY_CHAINED_SETUP_HOOK"
