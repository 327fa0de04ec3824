"""RL training loop benchmark: a real GRPO loop on a tiny policy the script pretrains itself, publishing every step's
weights into a running SGLang CPU server, so each publication mode's effect on training is measured, not assumed.

Entry point: `python benchmark/rl_train` (the folder; `__main__` is the CLI). One module per step:
  task        the synthetic verifiable task (list operations over digit tokens behind a shared system prompt;
              single-turn, and multi-turn with environment feedback appended) and its exact reward
  policy      the tiny Llama (the test models' architecture, float32): built, pretrained until clearly better
              than chance, saved as a checkpoint SGLang loads; the trainer's teacher-forced log-probs
  rollout     n samples per prompt at temperature 1 on the server with the engine's log-probs (return_logprob)
  provenance  each sampled token's provenance (fresh / crossing / reused stale), read by the product's consumer
              API `vradix.trainer.TokenVersions` from the response, or for stock servers from what the shadow of
              the cache (benchmark/rl_rollout) supplies in the same fields
  grpo        group-normalised advantages, PPO-clip against the rollout log-probs, the mismatch metrics, the
              provenance corrections, KL between consecutive policies
  trainer     one GRPO step: log-probs under the current weights and under the weights that sampled each token
  loop        one-step-off asynchronous GRPO on one server, a publication into it after every step
  modes       the runs: benchmark/rl_rollout's publication modes, and K = 1 with a trainer that uses the provenance
  report      the per-step table
  plots       the figures: mismatch over steps per run, prompt work against mismatch
  invariants  what must hold whatever the seed (`--check`, the CI smoke)

    python benchmark/rl_train                                             # every run, both workloads, 8 steps
    python benchmark/rl_train --runs in_place,in_place+vradix --steps 2   # one pair

Workloads: `grpo` (one turn) and `multiturn` (--turns turns per episode; each turn's prompt is the whole history:
the model's earlier answers and the environment's feedback). Every run gets the same policy, prompts and request
seeds, each on its own CPU server (started one at a time).

Runs: radix-off, retract+flush, retract+vradix (retract pause, vradix on, no flush: retracted requests re-prefill under
the new weights and keep the cache), in_place (unsafe), in_place+vradix (exact), in_place+vradix+tis (exact, the
trainer applying `vradix.trainer`'s truncated importance weights to the crossing tokens), in_place+vradix(1) (bounded
staleness K = 1, the trainer ignoring the provenance) and in_place+vradix(1)+provenance (K = 1, the trainer masking
the tokens whose sampling read reused stale KV, as docs/recipes.md tells users).
"""
