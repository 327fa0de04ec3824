"""The RL training loop benchmark's pieces (the package benchmark/rl_train/), without a server: the task and its
reward, GRPO's arithmetic against the textbook formulas on hand cases, the mismatch metrics, token provenance from
hand-built responses, the trainer's log-probs and step, and a pretraining that beats chance on held-out prompts."""
import math
import os
import random
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))

from rl_train import grpo, policy  # noqa: E402
from rl_train.grpo import CROSSING, FRESH, STALE  # noqa: E402
from rl_train.provenance import classify  # noqa: E402
from rl_train.task import (BAD, CHANCE, DIGITS, EOS, NEXT, OK, OPS, SEP, SYSTEM_FIRST, Question, Task,  # noqa: E402
                           episode_reward, marks, score)
from rl_train.trainer import Sample, Trainer  # noqa: E402

D = DIGITS


# ---- the task ---------------------------------------------------------------------------------------------------------
def test_answers_and_scores():
    q = Question("sort", (3, 1, 2))
    assert q.tokens() == [OPS["sort"], D[3], D[1], D[2], SEP]
    assert q.answer() == [D[1], D[2], D[3], EOS]
    assert Question("reverse", (3, 1, 2)).answer() == [D[2], D[1], D[3], EOS]
    assert Question("copy", (3, 1, 2)).answer() == [D[3], D[1], D[2], EOS]
    assert score(q, [D[1], D[2], D[3], EOS]) == 1.0
    assert score(q, [D[1], D[2], D[3]]) == 1.0                      # truncated before EOS: every position right
    assert score(q, [D[1], D[0], D[3], EOS]) == pytest.approx(2 / 3)
    assert score(q, [D[1], D[2], D[3], D[4], EOS]) == pytest.approx(3 / 4)   # an extra position is wrong
    assert score(q, [D[1], EOS]) == pytest.approx(1 / 3)
    assert score(q, [EOS]) == 0.0
    assert marks(q, [D[1], D[0], EOS]) == [OK, BAD, BAD]


def test_task_is_seeded_and_the_system_prompt_never_uses_task_tokens():
    a, b = Task.make(7, system_tokens=64), Task.make(7, system_tokens=64)
    assert a.system == b.system and a.system != Task.make(8, system_tokens=64).system
    assert len(a.system) == 64 and min(a.system) >= SYSTEM_FIRST > max(NEXT, SEP, *OPS.values(), *DIGITS)
    qs = a.episode(random.Random(1), 3)
    assert len({q.values for q in qs}) == 1 and len(qs) == 3
    env = Task.env_turn(qs[0], [EOS], qs[1])
    assert env == [BAD] * len(qs[0].values) + [NEXT] + qs[1].tokens()
    assert episode_reward(qs, [q.answer() for q in qs]) == 1.0


# ---- GRPO ---------------------------------------------------------------------------------------------------------------
def test_group_advantages_sum_to_zero_per_group_and_equal_rewards_give_none():
    r = [1.0, 0.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2, 0.9, 0.1, 0.3, 0.4]
    for scale in (True, False):
        a = grpo.group_advantages(r, 4, scale=scale).view(-1, 4)
        assert torch.allclose(a.sum(1), torch.zeros(3), atol=1e-6)
        assert torch.equal(a[1], torch.zeros(4))
    a = grpo.group_advantages(r, 4).view(-1, 4)
    assert a[0].std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    assert a[0].tolist() == pytest.approx([(x - 0.5) / math.sqrt(0.125) for x in r[:4]], abs=1e-4)
    with pytest.raises(ValueError):
        grpo.group_advantages(r, 5)


def test_ppo_clip_equals_the_textbook_formula_on_a_hand_case():
    eps = 0.2
    logp_old = torch.tensor([[-1.0, -2.0, -0.5, -1.5]])
    ratios = [1.5, 0.5, 1.1, 0.7]                       # above, below, inside, below the range
    logp = (logp_old + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    adv = torch.tensor([[2.0, -1.0, 3.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    loss, stats = grpo.ppo_clip_loss(logp, logp_old, adv, mask, eps)
    textbook = [min(r * a, min(max(r, 1 - eps), 1 + eps) * a) for r, a in zip(ratios, adv[0].tolist())]
    assert loss.item() == pytest.approx(-sum(textbook) / 4, abs=1e-6)
    # the clip removed the gradient of the first two tokens (rho out of range on the side A pushes it), not of
    # the others: inside the range, and below it with A > 0 (the min keeps the unclipped term)
    loss.backward()
    assert logp.grad[0, :2].tolist() == [0.0, 0.0] and all(g != 0 for g in logp.grad[0, 2:].tolist())
    assert stats["clip_active"] == pytest.approx(0.5)
    # masked and zero-weighted tokens do not count; per-sequence advantages broadcast over their tokens
    w = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    loss_w, _ = grpo.ppo_clip_loss(logp.detach(), logp_old, adv, mask, eps, weights=w)
    assert loss_w.item() == pytest.approx(-(textbook[0] + textbook[1] + textbook[3]) / 4, abs=1e-6)
    seq, _ = grpo.ppo_clip_loss(logp.detach(), logp_old, torch.tensor([2.0]), mask, eps)
    tok, _ = grpo.ppo_clip_loss(logp.detach(), logp_old, torch.full((1, 4), 2.0), mask, eps)
    assert seq.item() == pytest.approx(tok.item())


def test_mismatch_metrics_on_hand_cases():
    mask = torch.ones(1, 6)
    same = grpo.mismatch(torch.full((1, 6), -1.0), torch.full((1, 6), -1.0), mask)
    assert same["ess"] == pytest.approx(6.0) and same["ess_frac"] == pytest.approx(1.0)
    assert same["abs_delta"] == same["sq_log_ratio"] == same["clip_frac"] == 0.0
    # a constant log-ratio: every weight equal, so the ESS is still n
    shifted = grpo.mismatch(torch.full((1, 6), -0.7), torch.full((1, 6), -1.0), mask)
    assert shifted["ess"] == pytest.approx(6.0) and shifted["abs_delta"] == pytest.approx(0.3)
    assert shifted["sq_log_ratio"] == pytest.approx(0.09) and shifted["clip_frac"] == 1.0   # exp(0.3) - 1 > 0.2
    d = torch.tensor([[0.0, 0.1, -0.1, 50.0, 0.0, 0.0]])
    one = grpo.mismatch(d, torch.zeros(1, 6), mask)
    assert one["ess"] == pytest.approx(1.0, abs=1e-6) and one["max_abs_delta"] == pytest.approx(50.0)
    w = [math.exp(x) for x in [0.0, 0.1, -0.1]]
    partial = grpo.mismatch(d, torch.zeros(1, 6), torch.tensor([[1.0, 1, 1, 0, 0, 0]]))
    assert partial["tokens"] == 3 and partial["ess"] == pytest.approx(sum(w) ** 2 / sum(x * x for x in w))
    assert grpo.mismatch(d, d, torch.zeros(1, 6))["tokens"] == 0
    by = grpo.mismatch_by_class(d, torch.zeros(1, 6), mask, torch.tensor([[0, 0, 0, 2, 1, 1]]))
    assert (by["fresh"]["tokens"], by["crossing"]["tokens"], by["stale"]["tokens"], by["all"]["tokens"]) == (3, 2, 1, 6)
    assert by["stale"]["abs_delta"] == pytest.approx(50.0) and by["crossing"]["abs_delta"] == 0.0


def test_provenance_corrections():
    classes = torch.tensor([[FRESH, CROSSING, STALE, STALE]])
    rollout = torch.tensor([[-1.0, -1.0, -2.0, -0.1]])
    clean = torch.tensor([[-1.0, -1.2, -1.0, -1.0]])
    old, w = grpo.correction("none", classes, rollout, clean)
    assert torch.equal(old, rollout) and torch.equal(w, torch.ones(1, 4))
    old, w = grpo.correction("mask", classes, rollout)
    assert torch.equal(old, rollout) and w.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    old, w = grpo.correction("tis", classes, rollout, clean, cap=2.0)
    assert old.tolist() == [[-1.0, -1.0, -1.0, -1.0]]
    assert w[0].tolist() == pytest.approx([1.0, 1.0, 2.0, math.exp(-0.9)])   # exp(1) truncated to 2
    with pytest.raises(ValueError):
        grpo.correction("tis", classes, rollout)
    # the crossing tokens' TIS, as vradix.trainer.importance_weights computes it: the ratio against the trainer's own
    # log-probs, the weight min(pi_trainer / pi_rollout, cap) on crossing tokens only
    trainer = torch.tensor([[-0.5, -0.2, -1.0, -1.0]], requires_grad=True)
    old, w = grpo.correction("tis_crossing", classes, rollout, clean, cap=2.0, logp_trainer=trainer)
    assert old[0].tolist() == pytest.approx([-1.0, -0.2, -2.0, -0.1]) and not w.requires_grad
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 1.0, 1.0])        # exp(0.8) = 2.23 truncated to 2
    with pytest.raises(ValueError, match="trainer's log-probs"):
        grpo.correction("tis_crossing", classes, rollout)


def test_policy_kl_is_exact_over_the_vocabulary():
    p = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    q = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert grpo.policy_kl(p, q, torch.tensor([[1.0, 0.0]])) == pytest.approx(want, abs=1e-6)
    assert grpo.policy_kl(p, q, torch.tensor([[1.0, 1.0]])) == pytest.approx(want / 2, abs=1e-6)
    assert grpo.policy_kl(p, p, torch.ones(1, 2)) == 0.0


# ---- provenance ---------------------------------------------------------------------------------------------------------
ORDER = {"v0": 0, "v1": 1, "v2": 2}


def test_a_crossing_request_is_fresh_until_the_publication_then_crossing():
    # prompt of 10, 6 outputs; tokens 0-2 sampled by v0, 3-5 by v1; KV positions [0, 12) by v0, from 12 on by v1
    meta = {"weight_version": "v1", "weight_versions": [{"version": "v0", "start": 0, "end": 3},
                                                        {"version": "v1", "start": 3, "end": 6}],
            "kv_weight_versions": [{"version": "v0", "start": 0, "end": 12}, {"version": "v1", "start": 12, "end": 16}]}
    p = classify(10, 6, meta, ORDER)
    assert p.versions == ["v0"] * 3 + ["v1"] * 3
    assert p.classes == [FRESH] * 3 + [CROSSING] * 3 and p.staleness == [0, 0, 0, 1, 1, 1]


def test_a_request_that_reused_older_kv_is_stale_and_one_that_never_crossed_is_fresh():
    # bounded K = 1: admitted at v1, matched an 8-token prefix of the v0 namespace
    meta = {"weight_version": "v1", "kv_weight_versions": [{"version": "v0", "start": 0, "end": 8},
                                                           {"version": "v1", "start": 8, "end": 14}]}
    p = classify(10, 4, meta, ORDER)
    assert p.classes == [STALE] * 4 and p.staleness == [1] * 4 and p.versions == ["v1"] * 4
    assert classify(10, 4, {"weight_version": "v2"}, ORDER).classes == [FRESH] * 4
    # a stale prefix read only from the first token on: a one-token prompt reads nothing before its own position
    assert classify(1, 2, {"weight_version": "v1"}, ORDER).classes == [FRESH, FRESH]


def test_stock_provenance_comes_from_the_shadow_cache_and_the_sampler_spans():
    crossing = {"weight_version": "v1", "weight_versions": [{"version": "v0", "start": 0, "end": 2},
                                                            {"version": "v1", "start": 2, "end": 4}]}
    assert classify(10, 4, crossing, ORDER, stale_prefix=0).classes == [FRESH, FRESH, CROSSING, CROSSING]
    # retracted (retract+flush): re-prefilled under v1, so what v1 sampled read v1 KV
    assert classify(10, 4, {**crossing, "num_retractions": 1}, ORDER, stale_prefix=0).classes == [FRESH] * 4
    assert classify(10, 4, {"weight_version": "v1"}, ORDER, stale_prefix=5).classes == [STALE] * 4


# ---- the policy and the trainer ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    torch.set_num_threads(1)
    task = Task.make(0, system_tokens=8)
    return task, policy.build(0)


def test_teacher_forced_logprobs_match_sampling_and_ignore_right_padding(small):
    task, model = small
    rng = random.Random(3)
    prompts = [task.prompt(task.question(rng)) for _ in range(4)]
    # what the sampler's KV-cached decode assigns each sampled token, against one teacher-forced forward
    g = torch.Generator().manual_seed(0)
    responses = policy.sample(model, prompts, 5, 1.0, g)
    seqs = [p + r for p, r in zip(prompts, responses)]
    b = policy.Batch.of(seqs, [[0] * len(p) + [1] * len(r) for p, r in zip(prompts, responses)])
    lp = policy.token_logprobs(model, b.ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        alone = policy.token_logprobs(model, torch.tensor([p + r]))[0]
        assert torch.allclose(lp[i, :len(p) + len(r) - 1], alone, atol=1e-5)      # padding changed nothing
        with torch.no_grad():
            ids = torch.tensor([p])
            out = model(input_ids=ids, use_cache=True)
            inc = []
            for tok in r:
                inc.append(torch.log_softmax(out.logits[0, -1], -1)[tok].item())
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values, use_cache=True)
        assert alone[len(p) - 1:].tolist() == pytest.approx(inc, abs=1e-5)
        assert b.mask[i, len(p) - 1:len(p) + len(r) - 1].sum().item() == len(r) and b.mask[i].sum() == len(r)


def test_a_saved_policy_loads_as_the_same_float32_checkpoint(small, tmp_path):
    _, model = small
    path = policy.save(model, str(tmp_path / "ckpt"), {"seed": 0})
    assert {"config.json", "model.safetensors", "tokenizer.json", policy.META} <= set(os.listdir(path))
    back = policy.load(path)
    ids = torch.tensor([[5, 100, 200, 30, 11, 12, 40]])
    assert next(back.parameters()).dtype == torch.float32
    assert torch.equal(policy.token_logprobs(back, ids), policy.token_logprobs(model, ids))


def samples_from(task, model, groups=3, n=4, seed=0):
    """GRPO samples drawn with the HF sampler, the rollout log-probs its own teacher-forced ones (a perfect engine)."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    out = []
    for grp in range(groups):
        q = task.question(rng)
        p = task.prompt(q)
        for r in policy.sample(model, [p] * n, task.max_len + 2, 1.0, g):
            ids = p + r
            lp = policy.token_logprobs(model, torch.tensor([ids]))[0].tolist()
            out.append(Sample(grp, ids, [0] * len(p) + [1] * len(r), [0.0] + lp, [""] * len(p) + ["v0"] * len(r),
                              [FRESH] * len(ids), score(q, r)))
    return out


def test_a_trainer_step_on_exact_rollouts_sees_no_mismatch_and_moves_the_policy(small):
    task, model = small
    import copy
    tr = Trainer(copy.deepcopy(model), lr=1e-2)
    tr.snapshot("v0")
    samples = samples_from(task, tr.model, groups=3, n=4)
    for i, s in enumerate(samples):
        s.reward = float(i % 2)          # every group has signal, whatever the random init sampled
    # one group with a crossing token whose rollout log-prob is off by 0.5
    samples[0].classes = [CROSSING if s else FRESH for s in samples[0].sampled]
    samples[0].rollout_logprobs = [x - 0.5 if s else x for x, s in zip(samples[0].rollout_logprobs,
                                                                         samples[0].sampled)]
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.step(samples, 4)
    ev = m["engine_vs_sampler"]
    assert ev["fresh"]["tokens"] > 0 and ev["fresh"]["abs_delta"] < 1e-5 and ev["fresh"]["ess_frac"] > 0.999
    assert ev["crossing"]["abs_delta"] == pytest.approx(0.5, abs=1e-4) and ev["stale"]["tokens"] == 0
    # before the step the trainer's weights are the sampler's: the PPO ratio's view equals the engine's
    assert m["train_vs_rollout"]["fresh"]["abs_delta"] < 1e-5
    assert m["tokens"] == sum(sum(s.sampled) for s in samples)
    assert m["grad_norm"] > 0 and m["kl_to_next"] > 0 and m["reward"] == 0.5
    assert any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    with pytest.raises(KeyError):
        tr.logprobs_under("v9", torch.tensor([[1, 2]]))


def test_pretraining_is_deterministic_and_beats_chance_on_held_out_prompts(small):
    task, _ = small
    a, b = policy.build(1), policy.build(1)
    policy.pretrain(a, task, 1, max_steps=3, eval_every=1000, batch=8)
    policy.pretrain(b, task, 1, max_steps=3, eval_every=1000, batch=8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    model = policy.build(0)
    before = policy.evaluate(model, task, 0, 48)
    target = 3 * CHANCE
    res = policy.pretrain(model, task, 0, target=target, max_steps=400, eval_every=25, eval_prompts=48)
    assert before["reward"] < CHANCE                 # a random init spreads its mass over the whole vocabulary
    assert res.reward >= target and res.steps < 400, res.history


def test_a_multi_turn_trajectory_becomes_one_sample_with_every_turns_tokens_and_provenance():
    from rl_rollout.client import Record
    from rl_train.rollout import Trajectory, to_samples
    task = Task.make(0, system_tokens=4)
    qs = [Question("copy", (1, 2)), Question("sort", (1, 2))]
    p0 = task.prompt(qs[0])
    out0 = [D[1], D[3], EOS]                                    # one position wrong
    p1 = p0 + out0 + Task.env_turn(qs[0], out0, qs[1])
    out1 = [D[1], D[2], EOS]                                    # right, sampled by v1 over history computed by v0
    m0 = {"weight_version": "v0", "output_token_logprobs": [[-0.1, D[1]], [-0.2, D[3]], [-0.3, EOS]]}
    m1 = {"weight_version": "v1", "output_token_logprobs": [[-0.4, D[1]], [-0.5, D[2]], [-0.6, EOS]],
          "kv_weight_versions": [{"version": "v0", "start": 0, "end": 6}, {"version": "v1", "start": 6,
                                                                             "end": len(p1) + 3}]}
    trajs = [Trajectory(0, 0, qs, [Record("g0s0", 0, p0, out0, m0), Record("g0s0", 1, p1, out1, m1)])]
    (s,) = to_samples(trajs, ORDER)
    assert s.ids == p1 + out1 and s.reward == pytest.approx((0.5 + 1.0) / 2)
    at0, at1 = len(p0), len(p1)
    assert [i for i, x in enumerate(s.sampled) if x] == [at0, at0 + 1, at0 + 2, at1, at1 + 1, at1 + 2]
    assert s.rollout_logprobs[at0:at0 + 3] == [-0.1, -0.2, -0.3] and s.rollout_logprobs[at1:] == [-0.4, -0.5, -0.6]
    assert s.versions[at0] == "v0" and s.versions[at1] == "v1" and s.versions[0] == ""
    # turn 1 read positions [0, 6) computed by v0, older than its admission version v1: reused stale KV
    assert s.classes[at0:at0 + 3] == [FRESH] * 3 and s.classes[at1:] == [STALE] * 3


def test_the_stock_shadow_counts_a_next_turns_reuse_of_old_kv_and_not_of_its_own_versions():
    from rl_rollout.client import Record
    from rl_train.provenance import stock_stale_prefixes

    def rec(ids, out, cached, version, fe, fin):
        return Record("r", 0, list(ids), list(out), {"cached_tokens": cached, "weight_version": version,
                                                    "forward_entry_time": fe, "request_finished_ts": fin})
    turn1 = rec(range(100, 110), [D[1], D[2], EOS], 0, "v0", 1.0, 2.0)
    # the next turn matched the whole first turn, its EOS included (SGLang keeps the KV of every output position)
    turn2 = rec(list(range(100, 110)) + [D[1], D[2], EOS, OK], [EOS], 13, "v0", 3.0, 3.5)
    # after a publication, a sibling turn served the same 13 positions from the tree: nothing computed them under v1
    after = rec(list(range(100, 110)) + [D[1], D[2], EOS, BAD], [EOS], 13, "v1", 5.0, 5.5)
    out = stock_stale_prefixes([turn1, turn2, after])
    assert (out[id(turn1)], out[id(turn2)], out[id(after)]) == (0, 0, 13)
    # retract+flush: a request retracted at the publication is re-prefilled under v1, its whole sequence included,
    # so a next turn at v1 that reuses all of it reused nothing stale
    crossed = rec(range(100, 110), [D[1], D[2], EOS], 0, "v0", 1.0, 6.0)
    crossed.meta.update(weight_versions=[{"version": "v0", "start": 0, "end": 1}, {"version": "v1", "start": 1, "end": 3}],
                        num_retractions=1)
    nxt = rec(list(range(100, 110)) + [D[1], D[2], EOS, OK], [EOS], 13, "v1", 7.0, 7.5)
    out = stock_stale_prefixes([crossed, nxt])
    assert out[id(nxt)] == 0


@pytest.mark.e2e
@pytest.mark.long  # four CPU servers and a trainer (~120 s on 2 cores): the benchmark's smoke; its rules are tested above
@pytest.mark.timeout(1200)
def test_smoke_two_steps_unsafe_in_place_against_vradix(tmp_path):
    """Two GRPO steps of multi-turn episodes on each of four CPU servers (one at a time): the loop's invariants hold
    (`--check`, `rl_train.invariants`): vradix exact reads no stale KV and its fresh tokens are at the numerical
    floor, with and without the trainer's TIS on crossing tokens (which reweights crossing tokens only); retract
    with vradix has no stale and no crossing token, every token at the floor; unsafe in_place reuses stale KV after
    the publication. With `--vradix-disabled` the same command exits 1 (docs/benchmarks.md shows the run)."""
    import json
    import subprocess
    out = tmp_path / "rl_train.json"
    runs = ["in_place", "in_place+vradix", "in_place+vradix+tis", "retract+vradix"]
    cmd = [sys.executable, os.path.join(ROOT, "benchmark", "rl_train"), "--runs", ",".join(runs),
           "--workload", "multiturn", "--steps", "2", "--prompts", "4", "--samples", "4", "--turns", "3",
           "--system-tokens", "32", "--pretrain-target", "0.3", "--workdir", str(tmp_path / "work"),
           "--json", str(out), "--plots", str(tmp_path / "plots"), "--raw", str(tmp_path / "raw.jsonl"), "--check"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1140, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "invariants: hold (4 runs)" in proc.stdout
    res = {r["run"]: r for r in json.loads(out.read_text())["results"]}
    assert set(res) == set(runs)
    # retract+vradix really retracted: requests in flight at a publication were retracted and re-prefilled (and
    # the invariants found no crossing token among them)
    raw = [json.loads(line) for line in (tmp_path / "raw.jsonl").read_text().splitlines()]
    retracted = [r for r in raw if r["run"] == "retract+vradix" and r["meta"].get("num_retractions", 0) > 0]
    assert retracted, "no request was in flight at a retract publication"
    assert sorted(os.listdir(tmp_path / "plots")) == ["mismatch_over_steps.png", "work_vs_mismatch.png"]


def test_the_invariants_catch_stale_reuse_in_the_exact_run_and_its_absence_in_the_unsafe_one():
    from rl_train.invariants import violations

    def row(step, stale=0, reused=0, fresh_max=1e-6, stale_delta=0.0):
        return {"step": step, "reward": 0.5, "kl_to_next": 1e-3, "grad_norm": 1.0,
                "tokens_by_class": {"fresh": 10, "crossing": 0, "stale": stale}, "stale_prompt_tokens_reused": reused,
                "engine_vs_sampler": {"fresh": {"max_abs_delta": fresh_max}, "crossing": {"max_abs_delta": 0.0},
                                      "stale": {"abs_delta": stale_delta, "max_abs_delta": stale_delta}}}

    def result(run, rows):
        return {"workload": "multiturn", "run": run, "rows": rows, "publications": [{}] * len(rows)}

    good = [result("in_place+vradix", [row(0), row(1)]),
            result("in_place", [row(0), row(1, stale=40, reused=900, stale_delta=2e-2)])]
    assert violations(good) == []
    # vradix disabled under the exact run: stale reads look fresh, and sit far off the floor
    assert len(violations([result("in_place+vradix", [row(0), row(1, fresh_max=3e-2)])])) == 1
    assert len(violations([result("in_place+vradix", [row(0), row(1, stale=4, reused=64)])])) == 1
    assert len(violations([result("in_place", [row(0), row(1)])])) == 1
    # retract+vradix: a crossing or stale token, or a token off the floor, breaks it
    assert violations([result("retract+vradix", [row(0), row(1)])]) == []
    crossing = row(1)
    crossing["tokens_by_class"]["crossing"] = 3
    assert len(violations([result("retract+vradix", [row(0), crossing])])) == 1
    assert len(violations([result("retract+vradix", [row(0), row(1, stale=2)])])) == 1
    # in_place+vradix+tis: the exact run's rules, and only crossing tokens reweighted
    tis = row(1)
    tis["reweighted"] = {"tokens": 4, "mean_weight": 1.1}
    assert len(violations([result("in_place+vradix+tis", [row(0), tis])])) == 1
    tis["tokens_by_class"]["crossing"] = 4
    assert violations([result("in_place+vradix+tis", [row(0), tis])]) == []
    assert len(violations([result("in_place+vradix+tis", [row(0), row(1, fresh_max=3e-2)])])) == 1


def test_the_runs_are_the_rollout_benchmarks_modes_and_the_cli_runs_them_all_by_default():
    from rl_rollout.modes import MODES
    from rl_train.__main__ import parse_args
    from rl_train.modes import RUNS
    assert all(r.mode is MODES[r.mode.name] for r in RUNS.values())
    assert {r.mode.name for r in RUNS.values()} == {"radix-off", "retract+flush", "retract+vradix", "in_place",
                                                    "in_place+vradix", "in_place+vradix(1)"}
    assert RUNS["in_place+vradix(1)+provenance"].correction == "mask"
    assert RUNS["in_place+vradix+tis"].correction == "tis_crossing"
    assert RUNS["in_place+vradix+tis"].mode is RUNS["in_place+vradix"].mode
    retract = RUNS["retract+vradix"].mode
    assert (retract.pause_mode, retract.flush, retract.radix, retract.vradix) == ("retract", False, True, True)
    assert all(r.correction in grpo.CORRECTIONS for r in RUNS.values())
    a = parse_args([])
    assert a.runs == list(RUNS) and a.workload == ["grpo", "multiturn"]
    with pytest.raises(SystemExit):
        parse_args(["--runs", "in_place+vradix(3)"])


def test_a_crossing_the_sampler_spans_do_not_record_is_caught_by_the_publication_clock():
    from rl_rollout.schedule import Publication
    from rl_train.provenance import unlabelled_crossing
    pubs = [Publication(1, "v1", "train step", 0, boundary=10.0), Publication(2, "v2", "train step", 0, boundary=20.0)]
    # every token labelled v2, yet the first forward ran before v2 was loaded
    assert unlabelled_crossing({"weight_version": "v2", "forward_entry_time": 19.9}, pubs)
    assert not unlabelled_crossing({"weight_version": "v2", "forward_entry_time": 20.1}, pubs)
    # a recorded crossing names the version of its first forward
    spans = [{"version": "v1", "start": 0, "end": 2}, {"version": "v2", "start": 2, "end": 4}]
    assert not unlabelled_crossing({"weight_versions": spans, "forward_entry_time": 19.9}, pubs)
    assert not unlabelled_crossing({"weight_version": "v0", "forward_entry_time": 1.0}, pubs)
    p = classify(10, 3, {"weight_version": "v2"}, ORDER, stale_prefix=0, unlabelled=True)
    assert p.classes == [CROSSING] * 3 and p.versions == ["v2"] * 3


def test_the_plots_average_by_tokens_and_write_two_figures(tmp_path):
    from rl_train import plots

    def cls(tokens, delta):
        return {"tokens": tokens, "abs_delta": delta}

    def row(step, fresh, crossing, stale, computed, ideal):
        return {"step": step, "engine_vs_sampler": {"fresh": fresh, "crossing": crossing, "stale": stale},
                "prompt_tokens_computed": computed, "ideal_prompt_tokens": ideal}

    rows = [row(0, cls(10, 1e-7), cls(0, 0.0), cls(0, 0.0), 300, 100),
            row(1, cls(5, 1e-7), cls(5, 0.5), cls(10, 0.03), 100, 100)]
    # non-crossing tokens only: (10 * 1e-7 + 5 * 1e-7 + 10 * 0.03) / 25; every token adds the crossing ones
    assert plots.mismatch(rows) == pytest.approx((15e-7 + 0.3) / 25)
    assert plots.mismatch(rows, ("fresh", "crossing", "stale")) == pytest.approx((15e-7 + 2.5 + 0.3) / 30)
    assert plots.mismatch(rows[:1], ("crossing",)) == plots.FLOOR
    assert plots.work(rows) == 2.0
    results = [{"workload": w, "run": r, "rows": rows} for w in ("grpo", "multiturn") for r in ("a", "b")]
    paths = plots.write(results, str(tmp_path))
    assert [os.path.basename(p) for p in paths] == ["mismatch_over_steps.png", "work_vs_mismatch.png"]
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in paths)
