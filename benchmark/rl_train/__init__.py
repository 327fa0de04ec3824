"""RL training loop benchmark: a real GRPO loop on a tiny policy the script pretrains itself, publishing every step's
weights into a running SGLang CPU server, so each publication mode's effect on training is measured, not assumed.

One module per step:
  task        the synthetic verifiable task (list operations over digit tokens behind a shared system prompt;
              single-turn and multi-turn with environment feedback) and its exact reward
  policy      the tiny Llama (the test models' architecture, float32): built, pretrained until clearly better
              than chance, saved as a checkpoint SGLang loads; the trainer's teacher-forced log-probs
  provenance  each sampled token's provenance (fresh / crossing / reused stale) from the response: vradix's
              `kv_weight_versions`, or for stock servers the shadow of the cache (benchmark/rl_rollout)
  grpo        group-normalised advantages, PPO-clip against the rollout log-probs, the mismatch metrics, the
              provenance corrections, KL between consecutive policies
  trainer     one GRPO step: log-probs under the current weights and under the weights that sampled each token

The publication modes are benchmark/rl_rollout's (`rl_rollout.modes`).
"""
