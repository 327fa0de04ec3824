"""The policy: a tiny Llama of the test models' architecture (`vradix.testing.models.llama`: vocab 512, hidden 64,
2 layers, float32), pretrained here on the task (`task.py`) until it is clearly better than chance, saved as an HF
checkpoint directory SGLang loads; and the trainer's side of every log-prob: teacher-forced, float32, in torch.

Deterministic for a seed on one machine and thread count: the initial weights (torch.manual_seed), the pretraining
data (random.Random) and the stopping rule (held-out reward, on a seeded sample) are all drawn from it.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .task import CHANCE, EOS, PAD, VOCAB, Task, score

#: the checkpoint's own record of how it was made (next to config.json)
META = "rl_train_policy.json"


def tiny_config(layers: int = 2, hidden: int = 64):
    """The test models' Llama configuration (`vradix.testing.models.llama.generate`), float32."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=False, bos_token_id=0, eos_token_id=EOS, pad_token_id=PAD,
                       torch_dtype="float32")


def build(seed: int, **config_kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(**config_kw)).float()
    model.generation_config.pad_token_id = PAD
    return model


def _quiet() -> None:
    """No per-call progress bars from transformers (a checkpoint is saved and loaded every step)."""
    from transformers.utils import logging
    logging.disable_progress_bar()


def save(model, out: str, meta: Optional[dict] = None) -> str:
    """An HF checkpoint directory SGLang loads (safetensors, float32, the test models' word-level tokenizer)."""
    from vradix.testing.models.llama import save_tokenizer

    _quiet()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(out)
    if meta is not None:
        with open(os.path.join(out, META), "w") as f:
            json.dump(meta, f, indent=1)
    return out


def load(path: str):
    from transformers import LlamaForCausalLM

    _quiet()
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)


# ---- teacher-forced log-probs ----------------------------------------------------------------------------------------
@dataclass
class Batch:
    """Right-padded sequences: `ids[b, t]`; `mask[b, t]` is 1 where token t + 1 of row b is trained (its log-prob,
    `logprobs(...)[b, t]`, counts), 0 elsewhere (prompt, environment tokens, padding)."""

    ids: torch.Tensor     # [B, L] long
    mask: torch.Tensor    # [B, L - 1] float

    @classmethod
    def of(cls, seqs: Sequence[Sequence[int]], masks: Sequence[Sequence[int]]) -> "Batch":
        """`masks[b][t]` (same length as seqs[b]) is 1 where token t of row b is trained."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
        mask = torch.zeros(len(seqs), width)
        for b, (s, m) in enumerate(zip(seqs, masks)):
            assert len(s) == len(m), "a mask per token"
            ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[b, :len(m)] = torch.tensor(list(m), dtype=torch.float)
        return cls(ids, mask[:, 1:])


def full_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """log-softmax over the vocabulary of the next token at every position, [B, L - 1, V]. Right padding needs no
    attention mask: causal attention never lets a position read a later one."""
    return torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)


def token_logprobs(model, ids: torch.Tensor, full: Optional[torch.Tensor] = None) -> torch.Tensor:
    """log p(ids[b, t + 1] | ids[b, :t + 1]), [B, L - 1]."""
    full = full_logprobs(model, ids) if full is None else full
    return full.gather(-1, ids[:, 1:, None]).squeeze(-1)


# ---- pretraining ----------------------------------------------------------------------------------------------------
def noisy(answer: List[int], rng: random.Random, p: float) -> List[int]:
    """The answer with each digit replaced by a random one with probability p (an earlier turn's imperfect answer)."""
    from .task import DIGITS
    return [rng.choice(DIGITS) if tok != EOS and rng.random() < p else tok for tok in answer]


def pretrain_example(task: Task, rng: random.Random, max_turns: int) -> Tuple[List[int], List[int]]:
    """One teacher-forced sequence and its loss mask: an episode of 1..max_turns turns in the rollout format, the
    last answer correct and trained; an earlier answer is noised half the time (and then not trained), so the
    environment's marks take both values."""
    turns = rng.randint(1, max_turns)
    qs = task.episode(rng, turns)
    seq, mask = task.prompt(qs[0]), [0] * len(task.prompt(qs[0]))
    for t, q in enumerate(qs):
        last = t == turns - 1
        ans = q.answer() if last or rng.random() < 0.5 else noisy(q.answer(), rng, 0.3)
        seq += ans
        mask += [int(ans == q.answer())] * len(ans)
        if not last:
            env = task.env_turn(q, ans, qs[t + 1])
            seq += env
            mask += [0] * len(env)
    return seq, mask


@dataclass
class PretrainResult:
    steps: int
    seconds: float
    reward: float            # held-out, sampled at temperature 1, single turn
    greedy_reward: float     # held-out, greedy, single turn
    history: List[dict]


def pretrain(model, task: Task, seed: int, *, target: float = 0.5, max_steps: int = 3000, batch: int = 32,
             lr: float = 3e-3, max_turns: int = 3, eval_every: int = 100, eval_prompts: int = 96,
             progress: Optional[Callable[[dict], None]] = None) -> PretrainResult:
    """Teacher-forced cross-entropy on the answers (AdamW) until the held-out mean reward sampled at temperature 1
    reaches `target` (checked every `eval_every` steps) or `max_steps`. Stopping at a modest target leaves the
    policy room to improve under RL."""
    rng = random.Random(f"{seed}:pretrain")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0, history, step = time.perf_counter(), [], 0
    ev = {"reward": 0.0, "greedy_reward": 0.0}
    while step < max_steps:
        model.train()
        b = Batch.of(*zip(*(pretrain_example(task, rng, max_turns) for _ in range(batch))))
        lp = token_logprobs(model, b.ids)
        loss = -(lp * b.mask).sum() / b.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % eval_every == 0 or step == max_steps:
            ev = evaluate(model, task, seed, eval_prompts)
            history.append({"step": step, "loss": round(loss.item(), 4), **ev,
                            "seconds": round(time.perf_counter() - t0, 1)})
            if progress:
                progress(history[-1])
            if ev["reward"] >= target:
                break
    model.eval()
    return PretrainResult(step, time.perf_counter() - t0, ev["reward"], ev["greedy_reward"], history)


# ---- sampling with the HF model (evaluation; the rollouts themselves run on the SGLang server) ------------------------
@torch.no_grad()
def sample(model, prompts: Sequence[List[int]], max_new_tokens: int, temperature: float,
           generator: Optional[torch.Generator] = None) -> List[List[int]]:
    """Responses to `prompts` (each up to and including EOS, or `max_new_tokens`), at `temperature` (0: greedy) over
    the whole vocabulary. Prompts of one length run as one batch (no padding)."""
    model.eval()
    out: List[Optional[List[int]]] = [None] * len(prompts)
    by_len = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for n, idx in sorted(by_len.items()):
        ids = torch.tensor([prompts[i] for i in idx], dtype=torch.long)
        past, x, done = None, ids, torch.zeros(len(idx), dtype=torch.bool)
        gen = []
        for _ in range(max_new_tokens):
            o = model(input_ids=x, past_key_values=past, use_cache=True)
            past, logits = o.past_key_values, o.logits[:, -1].float()
            if temperature > 0:
                tok = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
            else:
                tok = logits.argmax(-1)
            tok = torch.where(done, torch.full_like(tok, PAD), tok)
            gen.append(tok)
            done |= tok == EOS
            if done.all():
                break
            x = tok[:, None]
        rows = torch.stack(gen, 1).tolist()
        for j, i in enumerate(idx):
            r = rows[j]
            out[i] = r[:r.index(EOS) + 1] if EOS in r else [t for t in r if t != PAD]
    return out  # type: ignore[return-value]


def evaluate(model, task: Task, seed: int, prompts: int = 96) -> dict:
    """Held-out single-turn mean reward, sampled at temperature 1 (what GRPO sees) and greedy. The questions come from
    a stream the pretraining never draws from."""
    rng = random.Random(f"{seed}:heldout")
    qs = [task.question(rng) for _ in range(prompts)]
    ps = [task.prompt(q) for q in qs]
    g = torch.Generator().manual_seed(seed)
    n = task.max_len + 2
    sampled = sample(model, ps, n, 1.0, g)
    greedy = sample(model, ps, n, 0.0)
    return {"reward": round(sum(score(q, r) for q, r in zip(qs, sampled)) / prompts, 4),
            "greedy_reward": round(sum(score(q, r) for q, r in zip(qs, greedy)) / prompts, 4)}


def make_policy(out: str, seed: int, task: Task, log: Callable[[str], None] = lambda s: None, **kw) -> str:
    """Build, pretrain and save the policy at `out`; reuse a checkpoint there made with the same seed and task."""
    meta_path = os.path.join(out, META)
    want = {"seed": seed, "system": task.system, "min_len": task.min_len, "max_len": task.max_len,
            "ops": list(task.ops), "pretrain": {k: v for k, v in sorted(kw.items()) if k != "progress"}}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            have = json.load(f)
        if {k: have.get(k) for k in want} == want:
            log(f"policy: reusing {out} (held-out reward {have['result']['reward']}, chance {CHANCE:.2f})")
            return out
    model = build(seed)
    res = pretrain(model, task, seed, progress=lambda h: log(f"pretrain step {h['step']}: loss {h['loss']}, "
                                                             f"held-out reward {h['reward']} (greedy "
                                                             f"{h['greedy_reward']})"), **kw)
    log(f"policy: pretrained {res.steps} steps in {res.seconds:.1f}s, held-out reward {res.reward} "
        f"(greedy {res.greedy_reward}, chance {CHANCE:.2f})")
    save(model, out, {**want, "result": {"steps": res.steps, "seconds": round(res.seconds, 1),
                                         "reward": res.reward, "greedy_reward": res.greedy_reward,
                                         "chance": CHANCE, "history": res.history}})
    return out

