"""The benchmark scripts whose tables the docs cite still run (tiny sizes; the figures themselves are not checked
here). A renamed module or a changed API otherwise only shows up when someone re-measures."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def run_script(*argv, timeout=600):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
    out = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.long  # four child processes (49 s in CI's run) on hooks the cache-level tests drive: the benchmark's smoke
def test_bench_publication_prints_both_tables():
    out = run_script("benchmark/cache/bench_publication.py", "--sizes", "500", "--repeats", "1",
                     "--cores", "rust,python", "--steady-requests", "20", "--steady-runs", "1")
    assert "# publication cost" in out and "# steady state" in out
    assert "| rust | 500 |" in out and "| python | 500 |" in out


@pytest.mark.e2e
@pytest.mark.long  # two servers on paths the E2E backstop tests cover; the benchmark's own smoke, not CI's
@pytest.mark.timeout(400)
def test_bench_steady_state_smoke_prints_the_table():
    """Starts one stock and one vradix CPU server (concurrently); greedy outputs must match (the script checks)."""
    out = run_script("benchmark/server/bench_steady_state.py", "--smoke", timeout=380)
    row = re.search(r"^\| lpm \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% \| .* \| True \| (\d+) \| (\d+) \|$", out, re.M)
    assert row, out
    verified, host_reads = map(int, row.groups())
    assert 0 < host_reads <= verified  # the strict guard's backstop ran: one host read per checked extend batch


@pytest.mark.long  # the benchmark's smoke: the fingerprint kernels are tested in test_fingerprint.py
def test_bench_fingerprint_smoke_prints_the_table():
    out = run_script("benchmark/kernels/bench_fingerprint.py", "--smoke")
    assert re.search(r"^what +impl +device +bytes +time s +GB/s +s/GB", out, re.M)
    assert re.search(r"^weight 1 MiB +torch +cpu +1048576 ", out, re.M)
    assert re.search(r"^tiny llama \(module\) +torch +cpu +\d+ ", out, re.M)


def test_bench_identity_smoke_proves_one_identity_on_every_tp_size():
    out = run_script("benchmark/kernels/bench_identity.py", "--mib", "1", "--tensors", "16", "--tp", "1", "2", "4")
    rows = re.findall(r"^ +(\d) +[\d.]+ +(\d+) +[\d.]+ +[\d.]+  ([0-9a-f]{32}) \(complete\)$", out, re.M)
    assert [r[0] for r in rows] == ["1", "2", "4"] and len({r[2] for r in rows}) == 1, out
    assert int(rows[0][1]) > int(rows[1][1]) > int(rows[2][1])  # each rank digests less as TP grows


@pytest.mark.e2e
@pytest.mark.long
@pytest.mark.timeout(1200)
def test_bench_hicache_smoke_prints_three_tables():
    """Starts nine real CPU servers in two waves (about 4 minutes on 2 cores), on the paths test_e2e_hicache covers
    already, so it is a long profile: `make test-long`."""
    out = run_script("benchmark/server/bench_hicache.py", "--smoke", timeout=1100)
    assert "# 1. in_place publication with L2 populated" in out and "\n| 1 | " in out
    assert "| nonce (default) | False | 2 | 1200 |" in out and "| declared run1-step5 | True | 2 | 1200 |" in out
    assert "| stock | 2 |" in out and "| vradix (nonce) | 2 |" in out


SCRIPTS = ["benchmark/kernels/bench_kernels.py", "benchmark/kernels/bench_fingerprint.py",
           "benchmark/server/bench_hicache.py", "benchmark/server/tie_check.py", "benchmark/server/soak_publications.py",
           "benchmark/rl_rollout", "benchmark/server/bench_steady_state.py", "benchmark/server/bench_sched_cpu.py",
           "benchmark/cache/profile_steady.py", "benchmark/cache/bench_inspector.py", "scripts/hook_table.py",
           "benchmark/gpu_check/gpu_serve_check.py", "scripts/gpu_bundle.py"]

#: runs each script named on its command line as `__main__` with `--help`, one after another in one process (the
#: scripts' imports of SGLang are paid once), and prints each one's help after a `== <script>` line
HELP_EACH = """
import contextlib, io, runpy, sys
for script in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [script, "--help"]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            assert e.code in (0, None), (script, e.code)
    print("== " + script)
    print(out.getvalue())
"""


def test_every_script_answers_help():
    out = run_script("-c", HELP_EACH, *SCRIPTS, timeout=300)
    helps = dict(part.split("\n", 1) for part in out.split("== ")[1:])
    assert list(helps) == SCRIPTS
    for script, text in helps.items():
        assert "usage:" in text, (script, text[:500])


def load_script(relpath: str, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeProcess:
    """A `psutil.Process` stand-in: a title, a (kernel-truncated) name and children."""

    def __init__(self, title: str, children=()):
        self.title, self._children = title, list(children)

    def cmdline(self):
        return self.title.split()

    def name(self):
        return self.title.split()[0][:15]

    def children(self, recursive=False):
        return [d for c in self._children for d in [c, *(c.children(True) if recursive else ())]]


def test_bench_sched_cpu_arithmetic_and_scheduler_discovery():
    """No server: the per-request figure, the overhead and finding the scheduler among a server's descendants."""
    from vradix.testing.harness.process import scheduler_processes

    bench = load_script("benchmark/server/bench_sched_cpu.py", "bench_sched_cpu")
    assert bench.ms_per_request(10.0, 10.5, 25) == pytest.approx(20.0)
    assert bench.overhead_pct(20.0, 21.0) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        bench.ms_per_request(10.0, 9.0, 4)  # CPU time never goes back: a reading of another process
    sched = FakeProcess("sglang::scheduler")
    launcher = FakeProcess("python -m sglang.launch_server", [sched, FakeProcess("sglang::detokenizer")])
    assert scheduler_processes(launcher) == [sched]
    assert scheduler_processes(FakeProcess("python", [FakeProcess("python -c pass")])) == []
    assert bench.mismatches([[1, 2], [3]], [[1, 2], [4]]) == 1
    rows = {"grpo": {"workload": "grpo", "stock": 20.0, "vradix": 21.0, "overhead": 5.0, "requests": 8,
                     "mismatches": 0, "rounds": [{"first": "stock", "stock": 20.0, "vradix": 21.0}]}}
    assert "| grpo | 20.0 | 21.0 | +5.0% | 20.0 / 21.0 (stock) | 8 | 0 |" in bench.table(rows)


@pytest.mark.long  # the benchmark's smoke: the snapshot it times is tested in test_inspector.py and E2E
def test_bench_inspector_prints_the_table():
    out = run_script("benchmark/cache/bench_inspector.py", "--cached-tokens", "4000", "--systems", "8",
                     "--system-len", "64", "--suffix-len", "32", "--live", "4", "--iterations", "40",
                     "--poll-every", "5")
    for core in ("rust", "python"):
        assert re.search(rf"^\| {core} \| no polling \| \d+ \|", out, re.M), out
        assert re.search(rf"^\| {core} \| polled every 5 \| \d+ \| \d+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$",
                         out, re.M), out


def test_gpu_check_pd_command_lines_parse_with_sglangs_own_parser():
    """The P/D GPU check cannot run here (no GPU); its server command lines are at least ones SGLang 0.5.23 and
    vradix accept, flag by flag (`ServerArgs.add_cli_args`, with vradix's flags registered by the plugin)."""
    import argparse
    import importlib.util

    from sglang.srt.server_args import ServerArgs

    from vradix.hooks.launcher import FLAG, add_identity_flag

    path = os.path.join(ROOT, "benchmark", "gpu_check", "gpu_check_pd.py")
    spec = importlib.util.spec_from_file_location("gpu_check_pd", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    if FLAG not in parser._option_string_actions:  # vradix's hook after ServerArgs.add_cli_args, if not yet applied
        add_identity_flag(None, parser)
    for name, args in script.command_lines("mooncake").items():
        parsed = parser.parse_args(["--model-path", "m", "--port", "1", *args])
        assert parsed.disaggregation_mode in ("prefill", "decode"), name
        if "decode" in name:
            assert parsed.hicache_storage_prefetch_policy == "wait_complete", name


def test_gpu_check_hot_path_finds_the_planted_page_with_the_device_forms_on_cpu():
    """The hot-path GPU check's iteration (backstop launch, stamp, frees; verdicts read at their results) runs here
    with the device forms on CPU tensors: every verdict stays pending until its result, and the first one finds the
    stale page planted in request 1's prefix, as the host computation does. (The sync debug mode itself needs CUDA.)"""
    import importlib.util

    path = os.path.join(ROOT, "benchmark", "gpu_check", "gpu_check_hot_path.py")
    spec = importlib.util.spec_from_file_location("gpu_check_hot_path", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for page_size in (1, 16):
        world = script.World(1 << 12, page_size, rows=9, width=4352, device="cpu", impl="torch")
        assert world.ledger.kernels.name == "torch" and not world.ledger.kernels.host  # the device forms
        ok, what = script.check_no_sync(world, (8, 4096, 256), iterations=3)
        assert ok, what
        assert "3 verdicts pending until their results" in what and f"request 1: {page_size} positions" in what
