"""One prepared GPU check for P/D disaggregation: what the CPU test suite cannot run (see docs/pd.md, "GPU check").

    python benchmark/gpu_check/gpu_check_pd.py [--out DIR] [--transfer-backend mooncake] [--dry-run]

Two parts, each a real prefill/decode pair with vradix on both roles behind the real P/D router, on CUDA:
1. **hybrid** (one GPU): a tiny Mamba2+attention NemotronH (`vradix.testing.models.hybrid`, bf16) with SGLang's
   own CUDA/Triton Mamba kernels and its default `extra_buffer` strategy; decode runs its radix cache with HiCache L2
   and L3 `file` (`page_first_direct`, which the Mamba host pool needs). Checks: the recurrent state travels (output
   == a fresh non-P/D server), a decode prefix hit, a restore from decode's L3 after its device and host tiers were
   flushed, and an in-place publication on both roles with a request crossing it (0 retractions, then B's output);
2. **dcp** (two GPUs or more; otherwise reported as skipped): a tiny MLA model (DeepSeek-V2 layout) with decode at
   `--tp 2 --dcp-size 2` and L3 `file`: decode refuses to start with `best_effort`, starts with `wait_complete`, and a
   prompt restored from its L3 answers what a fresh non-P/D server answers.
The oracle of every output check is a fresh stock server (`VRADIX_DISABLE=1`, no P/D) on the same weights and flags.

Needs, on the GPU node (it cannot reach package registries: carry a wheelhouse): sglang 0.5.23 with its CUDA torch,
sglang-vradix (this repo, installed), `mooncake-transfer-engine` (the CUDA build), and the router `smg`. Prints one
`[gpu_check_pd] PASS|FAIL|SKIP <check>: <detail>` line per check and a summary; writes server logs and a JSON report
under `--out`. `--dry-run` prints the server command lines of both parts and starts nothing (runs anywhere).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from vradix.testing.harness.http import ServerClient  # noqa: E402
from vradix.testing.harness.pd import Router, RoutedPair  # noqa: E402
from vradix.testing.harness.process import LoggedProcess  # noqa: E402
from vradix.testing.harness.server import free_port  # noqa: E402

PROMPT = [(i * 7) % 480 + 20 for i in range(600)]
EXTENDED = PROMPT + [31, 32, 33, 34]
NEW_TOKENS = 8
COMMON = ["--host", "127.0.0.1", "--skip-tokenizer-init", "--dtype", "bfloat16", "--context-length", "4096",
          "--max-running-requests", "16"]
DECODE_L3 = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-storage-backend", "file",
             "--hicache-mem-layout", "page_first_direct", "--hicache-storage-prefetch-policy", "wait_complete"]
DCP = ["--tp", "2", "--dcp-size", "2", "--page-size", "64"]
RESULTS: List[dict] = []


def report(status: str, check: str, detail: str = "") -> None:
    RESULTS.append({"status": status, "check": check, "detail": detail})
    print(f"[gpu_check_pd] {status} {check}: {detail}", flush=True)


def expect(check: str, ok: bool, detail: str) -> bool:
    report("PASS" if ok else "FAIL", check, detail)
    return ok


class GpuServer(LoggedProcess, ServerClient):
    """`python -m sglang.launch_server` on CUDA with `args`, on a free loopback port; killed on exit."""

    stop_grace = 20.0

    def __init__(self, model: str, args: Sequence[str], *, vradix: bool, gpus: str, log_dir: str,
                 env: Optional[dict] = None, startup_timeout: float = 600.0):
        self.port = free_port()
        super().__init__(f"http://127.0.0.1:{self.port}", 300.0)
        e = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, **(env or {})}
        e.pop("VRADIX_DISABLE", None)
        if not vradix:
            e["VRADIX_DISABLE"] = "1"
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(self.port),
                    *COMMON, *args]
        self.log = tempfile.NamedTemporaryFile("w+", dir=log_dir, prefix="sglang-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=e,
                                     start_new_session=True)
        self._wait_ready(startup_timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if requests.get(self.url + "/health_generate", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.tail()}")


def refused_start(model: str, args: Sequence[str], gpus: str, log_dir: str, needle: str) -> str:
    """Start a server expected to refuse its arguments; the refusal text when its log names `needle`, else ''."""
    try:
        server = GpuServer(model, args, vradix=True, gpus=gpus, log_dir=log_dir, startup_timeout=300)
    except RuntimeError as e:
        return needle if needle in str(e) else ""
    server.stop()
    return ""


def pd_args(role: str, bootstrap_port: int, backend: str, extra: Sequence[str] = ()) -> List[str]:
    flags = ["--disaggregation-mode", role, "--disaggregation-transfer-backend", backend,
             "--vradix-weight-identity", "fingerprint", "--mem-fraction-static", "0.3"]
    if role == "prefill":
        flags += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    else:
        flags += ["--disaggregation-decode-enable-radix-cache"]
    return [*flags, *extra]


class GpuPair(RoutedPair):
    """prefill + decode `GpuServer`s and the real router (`vradix.testing.harness.pd.Router`) in front of them."""

    def __init__(self, model: str, *, backend: str, log_dir: str, prefill_gpus: str, decode_gpus: str,
                 prefill_extra: Sequence[str] = (), decode_extra: Sequence[str] = (), env: Optional[dict] = None):
        port = free_port()
        try:
            self.prefill = GpuServer(model, pd_args("prefill", port, backend, prefill_extra), vradix=True,
                                     gpus=prefill_gpus, log_dir=log_dir, env=env)
            self.decode = GpuServer(model, pd_args("decode", port, backend, decode_extra), vradix=True,
                                    gpus=decode_gpus, log_dir=log_dir, env=env)
            self.router = Router(self.prefill.url, port, self.decode.url, timeout=300)
        except BaseException:
            self.stop()
            raise
        super().__init__(self.router.url, 300.0)


def oracle(model_a: str, model_b: str, prompts: Sequence[Sequence[int]], args: Sequence[str], gpus: str,
           log_dir: str) -> Dict[str, List[List[int]]]:
    """A fresh stock non-P/D server's greedy outputs on A, then B (loaded with an idle flush)."""
    out = {}
    with GpuServer(model_a, [*args, "--mem-fraction-static", "0.3"], vradix=False, gpus=gpus, log_dir=log_dir) as s:
        out["A"] = [s.generate(p, NEW_TOKENS)["output_ids"] for p in prompts]
        s.reset(model_b, "B")
        out["B"] = [s.generate(p, NEW_TOKENS)["output_ids"] for p in prompts]
    return out


def decode_promised(body: dict) -> int:
    spans = body["meta_info"].get("pd_spans") or [{}]
    return spans[0].get("end", 0) if spans[0].get("role") == "decode_cache" else 0


def flush_decode_tiers(pair: GpuPair) -> None:
    deadline = time.monotonic() + 120
    while pair.decode.post("/flush_cache").status_code != 200:
        if time.monotonic() > deadline:
            raise TimeoutError("decode never idle for a flush")
        time.sleep(0.2)


def publish_in_place_with_crossing(pair: GpuPair, model: str, version: str) -> dict:
    """Pause both roles in place with a request decoding, update both, continue both; the crossing request's body."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        crossing = pool.submit(pair.generate, PROMPT[:200], 400)
        deadline = time.monotonic() + 120
        while pair.decode.server_info().get("internal_states", [{}])[0].get("num_running_reqs", 0) == 0:
            if time.monotonic() > deadline or crossing.done():
                break
            time.sleep(0.05)
        for server in (pair.prefill, pair.decode):
            server.pause("in_place")
        for server in (pair.prefill, pair.decode):
            server.update_weights(model, version)
        for server in (pair.prefill, pair.decode):
            server.resume()
        return crossing.result(timeout=600)


def hybrid_part(work: str, backend: str, gpu: str) -> None:
    from vradix.testing.models.hybrid import generate

    a, b = generate(os.path.join(work, "hybrid-A"), seed=1), generate(os.path.join(work, "hybrid-B"), seed=2)
    want = oracle(a, b, [PROMPT, EXTENDED], [], gpu, work)
    store = os.path.join(work, "hybrid-l3")
    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": store}
    with GpuPair(a, backend=backend, log_dir=work, prefill_gpus=gpu, decode_gpus=gpu, decode_extra=DECODE_L3,
                 env=env) as pair:
        first = pair.generate(PROMPT, NEW_TOKENS)
        expect("hybrid: recurrent state travels P->D", first["output_ids"] == want["A"][0], str(first["meta_info"]))
        ext = pair.generate(EXTENDED, NEW_TOKENS)
        expect("hybrid: decode prefix hit", decode_promised(ext) > 0 and ext["output_ids"] == want["A"][1],
               f"promised {decode_promised(ext)}")
        flush_decode_tiers(pair)
        again = pair.generate(PROMPT, NEW_TOKENS)
        expect("hybrid: restore from decode L3", decode_promised(again) > 0 and again["output_ids"] == want["A"][0],
               f"promised {decode_promised(again)}")
        crossed = publish_in_place_with_crossing(pair, b, "B")
        expect("hybrid: crossing request keeps its live state", crossed["meta_info"].get("num_retractions") == 0
               and crossed["meta_info"]["completion_tokens"] == 400, str(crossed["meta_info"].get("pd_spans")))
        after = pair.generate(EXTENDED, NEW_TOKENS)
        expect("hybrid: after the publication == fresh server on B", after["output_ids"] == want["B"][1],
               f"promised {decode_promised(after)}")


def tiny_mla_model(out: str, seed: int) -> str:
    """A random 2-layer DeepSeek-V2 (MLA) model, bf16, with the tiny models' tokenizer."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    from vradix.testing.models import llama

    torch.manual_seed(seed)
    cfg = DeepseekV2Config(vocab_size=llama.VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=64,
                           qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, n_routed_experts=None,
                           first_k_dense_replace=2, max_position_embeddings=4096, initializer_range=0.2,
                           tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    DeepseekV2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    llama.save_tokenizer(out)
    return out


def dcp_part(work: str, backend: str, gpus: int) -> None:
    if gpus < 2:
        report("SKIP", "dcp: decode --tp 2 --dcp-size 2 with L3", f"needs 2 GPUs, this node has {gpus}")
        return
    a, b = tiny_mla_model(os.path.join(work, "mla-A"), 1), tiny_mla_model(os.path.join(work, "mla-B"), 2)
    want = oracle(a, b, [PROMPT], [], "0", work)
    refused = refused_start(a, [*pd_args("decode", free_port(), backend, DCP), *DECODE_L3[:-1], "best_effort"],
                            "0,1", work, "wait_complete")
    expect("dcp: decode with best_effort L3 does not start", bool(refused), "log names wait_complete")
    store = os.path.join(work, "mla-l3")
    with GpuPair(a, backend=backend, log_dir=work, prefill_gpus="0", decode_gpus="0,1",
                 decode_extra=[*DCP, *DECODE_L3], env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": store}) as pair:
        first = pair.generate(PROMPT, NEW_TOKENS)
        expect("dcp: output == fresh server", first["output_ids"] == want["A"][0], "")
        flush_decode_tiers(pair)
        again = pair.generate(PROMPT, NEW_TOKENS)
        expect("dcp: restore from decode L3", decode_promised(again) > 0 and again["output_ids"] == want["A"][0],
               f"promised {decode_promised(again)}")


def run_part(name: str, body: Callable[[], None]) -> None:
    t0 = time.monotonic()
    try:
        body()
    except Exception as e:  # a part that cannot run is a failure of that part, not of the whole check
        report("FAIL", f"{name}: ran to the end", f"{type(e).__name__}: {e}"[:2000])
        traceback.print_exc()
    print(f"[gpu_check_pd] part {name} took {time.monotonic() - t0:.0f} s", flush=True)


def command_lines(backend: str) -> Dict[str, List[str]]:
    """The server arguments (after `--model-path M --port P`) each P/D role of each part starts with."""
    port = 30000
    return {"hybrid prefill": [*COMMON, *pd_args("prefill", port, backend)],
            "hybrid decode": [*COMMON, *pd_args("decode", port, backend, DECODE_L3)],
            "dcp prefill": [*COMMON, *pd_args("prefill", port, backend)],
            "dcp decode": [*COMMON, *pd_args("decode", port, backend, [*DCP, *DECODE_L3])]}


def dry_run(backend: str) -> None:
    """Print the command lines each part would start, without starting anything."""
    for name, args in command_lines(backend).items():
        print(f"{name}: python -m sglang.launch_server --model-path M --port P {' '.join(args)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/gpu_check_pd")
    p.add_argument("--transfer-backend", default="mooncake")
    p.add_argument("--parts", default="hybrid,dcp")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    if a.dry_run:
        dry_run(a.transfer_backend)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("[gpu_check_pd] no CUDA device: this check runs on a GPU node only", flush=True)
        return 2
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="run-", dir=a.out)
    gpus = torch.cuda.device_count()
    print(f"[gpu_check_pd] {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, work dir {work}")
    parts = {"hybrid": lambda: hybrid_part(work, a.transfer_backend, "0"),
             "dcp": lambda: dcp_part(work, a.transfer_backend, gpus)}
    for name in a.parts.split(","):
        run_part(name, parts[name])
    with open(os.path.join(a.out, "gpu_check_pd.json"), "w") as f:
        json.dump(RESULTS, f, indent=2)
    counts = {s: sum(r["status"] == s for r in RESULTS) for s in ("PASS", "FAIL", "SKIP")}
    print(f"[gpu_check_pd] summary: {counts}", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
