"""SGLang's Ray mode (`--use-ray`): each scheduler runs in a Ray `SchedulerActor`, which never calls `load_plugins()`.
vradix must be active in that actor's Scheduler, or the actor must refuse to start with an error naming vradix
(docs/fail-closed.md).

The E2E tests run the real actor path on CPU through `vradix.testing.harness.ray_cpu` (a local Ray cluster with one logical
GPU; the actor's one CUDA call, `torch.cuda.set_device`, is a no-op there): SGLang's Ray HTTP launcher, its
`RayEngine._launch_scheduler_processes`, `_create_scheduler_actor`, and the actor's `__init__` and event loop on the
tiny model. Not run here: more than one actor (TP/PP/DP over Ray), NCCL, and a multi-node placement group.
"""
import json
import subprocess
import sys

import pytest

from vradix.client import publish
from vradix.testing.harness.ray_cpu import ACTOR_ENV
from vradix.testing.harness.scenario import PROBE
from vradix.testing.harness.server import CpuServer, ServerDied

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.timeout(900)]

RAY = "vradix.testing.harness.ray_cpu"


@pytest.mark.e2e
def test_a_ray_scheduler_actor_serves_with_vradix_and_a_publication_is_verified(models):
    with CpuServer(models[0], launcher=RAY, startup_timeout=480) as s:
        (block,) = [st.get("vradix") for st in s.server_info()["internal_states"]]
        assert block is not None and block["active"], "the Ray scheduler actor serves without vradix"
        assert "SchedulerActor pid=" in s.logs()  # the scheduler really is a Ray actor
        s.generate(PROBE, 1)
        assert s.generate(PROBE, 1)["meta_info"]["cached_tokens"] > 0
        (res,) = publish([s.url], models[1], "ray-step1", timeout=240)
        assert res.verified and res.plan.pause_mode == "in_place" and res.epochs_after == [block["epoch"] + 1]
        after = s.generate(PROBE, 1)["meta_info"]
        assert after["cached_tokens"] == 0 and after["prefix_cache"]["weight_version"] == "ray-step1"
        assert "Traceback" not in s.logs()


@pytest.mark.e2e
@pytest.mark.parametrize("actor_env,says", [
    ({"VRADIX_FAULT_IMPORT": "1"}, "failed to install (ImportError: VRADIX_FAULT_IMPORT"),
    ({"SGLANG_PLUGINS": "some_other_plugin"},
     "is active in the launcher but not installed in this Ray scheduler actor (SGLANG_PLUGINS='some_other_plugin'"),
], ids=["install-fails-in-the-actor", "actor-excludes-vradix"])
def test_a_ray_scheduler_actor_without_vradix_refuses_to_start(models, actor_env, says):
    """The fault is in the actor's environment only: the launcher installed vradix, the actor cannot."""
    with pytest.raises(ServerDied) as died:
        CpuServer(models[0], launcher=RAY, env={ACTOR_ENV: json.dumps(actor_env)}, startup_timeout=480).stop()
    assert says in str(died.value) and "refusing to serve an unversioned radix cache" in str(died.value)


CHECK_DEFERRED = """
import os, sys
from sglang.srt.plugins import load_plugins
load_plugins()
assert "ray" not in sys.modules and "sglang.srt.ray.scheduler_actor" not in sys.modules, "Ray imported eagerly"
from sglang.srt.ray.engine import RayEngine
from sglang.srt.ray.scheduler_actor import SchedulerActor
from vradix.hooks.ray_actor import load_vradix_in_scheduler_actor
from vradix.plugin import is_installed
assert is_installed("sglang.srt.ray.scheduler_actor.SchedulerActor.options", load_vradix_in_scheduler_actor)
print("HOOKED-ON-IMPORT")
"""


def run_check(env_extra: dict) -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", **env_extra}
    env.pop("VRADIX_DISABLE", None)
    return subprocess.run([sys.executable, "-c", CHECK_DEFERRED], env=env, capture_output=True, text=True, timeout=300)


def test_the_ray_actor_hook_is_installed_when_sglang_ray_is_imported_and_not_before():
    out = run_check({})
    assert out.returncode == 0 and "HOOKED-ON-IMPORT" in out.stdout, out.stderr[-3000:]


def test_a_ray_actor_hook_that_cannot_be_installed_stops_the_import_naming_vradix():
    out = run_check({"VRADIX_FAULT_MISSING_HOOK": "SchedulerActor.options"})
    assert out.returncode != 0 and "HOOKED-ON-IMPORT" not in out.stdout
    assert "could not install hook(s) sglang.srt.ray.scheduler_actor.SchedulerActor.options" in out.stderr
