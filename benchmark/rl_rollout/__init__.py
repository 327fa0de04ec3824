"""RL rollout benchmark: four publication strategies on the same seeded RL traffic, on a real SGLang server.

Entry point: `python benchmark/rl_rollout` (the folder; `__main__` is the CLI). The data path, one module per step:
workload (seeded tasks) -> schedule (the publisher) -> client (rollout workers, the trace) -> shadow_cache (stale
reuse) and ideal (the yardstick) -> report (rows, tables, targets, PNG).

    python benchmark/rl_rollout                                # CPU: starts its own servers on tiny models
    python benchmark/rl_rollout --publish-every-requests 16,64,256 --prompts 64 --sessions 64   # a sweep
    python benchmark/rl_rollout --url http://HOST:PORT --mode in_place+vradix --weights CKPT_A,CKPT_B

Workloads (seeded; every mode gets the same requests in the same order and the same publication schedule):
  grpo   P prompts that share a system prompt of S tokens, n samples per prompt, response lengths drawn from a
         distribution (ignore_eos, so lengths are exact). Samples of a prompt are submitted back to back.
  agent  sessions of several turns; each turn resends the whole history (system prompt, task, earlier turns with the
         model's own output) plus a tool result.
A publication is triggered every K completed requests (--publish-every-requests; a comma-separated list runs the
whole benchmark once per K, on the same servers) and/or every T seconds (--publish-every-seconds). Requests already in flight cross it; requests not yet submitted are held until the
publication's `continue_generation` returned (SGLang's tokenizer holds them during a pause anyway).

Modes (what one publication is):
  radix-off        server with --disable-radix-cache (Reef's disjoint default, AReaL's default): pause in_place,
                   update_weights_from_disk(flush_cache=False), continue.
  retract+flush    stock SGLang (the miles#2782 / Reef#206 recipe): pause retract, update, POST /flush_cache (must
                   succeed), continue. Every in-flight request is re-prefilled under the new weights.
  in_place         stock SGLang, VRADIX_DISABLE=1: pause in_place, update, continue, no flush. Unsafe: stale KV stays
                   matchable.
  in_place+vradix  the same calls as in_place, on a server with vradix active.

Metrics per (workload, mode): prompt tokens actually computed (prefill work, from the server's Prometheus counter
`sglang:realtime_tokens_total{mode="prefill_compute"}`, which includes re-prefills), tokens re-prefilled because of
retraction (`prefill_compute` minus `sglang:prefill_effective_tokens_total{mode="input"}`, the counter that excludes
retracted requests' re-counts), cache hit rate (sum cached_tokens / sum prompt_tokens, from meta_info), stale tokens
reused (see `ShadowCache`), the prompt work of an ideal correct engine with an unbounded cache on the same trace
and the measured work over it (see `ideal.py`), the extra work split by what was missed (a prefix computed earlier,
or one in flight), requests completed, wall time, publication pause (pause sent -> continue returned; mean,
p99) and throughput. Output: tables on stdout, a JSON file, and a PNG (needs matplotlib).

Against an existing server (--url) the script cannot switch modes: run one --mode per server, started as follows
(add your usual model/parallelism flags; --enable-metrics is required for the counters and the per-request
timestamps the stale-reuse accounting orders events by):
  radix-off        VRADIX_DISABLE=1 python -m sglang.launch_server ... --enable-metrics --disable-radix-cache
  retract+flush    VRADIX_DISABLE=1 python -m sglang.launch_server ... --enable-metrics
  in_place         VRADIX_DISABLE=1 python -m sglang.launch_server ... --enable-metrics
  in_place+vradix  python -m sglang.launch_server ... --enable-metrics        (vradix installed and active)
The script checks /get_server_info against the mode and refuses a mismatched server. Publications load the
checkpoints of --weights in turn (default: the server's own model_path, reloaded; every load is a new version).
"""
