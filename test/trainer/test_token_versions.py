"""The trainer's consumer API (`vradix.trainer`) on responses in the shapes the server writes them (docs/provenance.md,
docs/bounded-staleness.md): per output token the sampler, the oldest and newest KV read, the staleness and the kind;
the mask and the truncated importance weights as lists, numpy and torch; the one label rule; the OpenAI shapes
(`metadata` and `sglext`); clear errors; and no SGLang import. The same API on live server responses:
`test_e2e_provenance.py::test_trainer_api_and_recipes_on_a_request_crossing_two_step_publications` and
`test_e2e_staleness.py::test_the_trainer_api_reads_stale_and_fresh_tokens_of_each_turn`."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from vradix.trainer import (CROSSING, FRESH, STALE, ResponseError, TokenVersions, importance_weights, mask, pad_rows,
                            truncated_weights, version)


def crossing_meta(labels=("7", "8", "9")):
    """A 10-token prompt, 8 output tokens crossing two publications: tokens 0-2 sampled by the first version, 3-5 by
    the second, 6-7 by the third; position P + k - 1 is the first one computed by token k's sampler."""
    a, b, c = labels
    return {"prompt_tokens": 10, "completion_tokens": 8, "weight_version": c, "num_retractions": 0,
            "weight_versions": [{"version": a, "start": 0, "end": 3}, {"version": b, "start": 3, "end": 6},
                                {"version": c, "start": 6, "end": 8}],
            "kv_weight_versions": [{"version": a, "epoch": 4, "start": 0, "end": 12},
                                   {"version": b, "epoch": 5, "start": 12, "end": 15},
                                   {"version": c, "epoch": 6, "start": 15, "end": 18}],
            "prefix_cache": {"cached_tokens": 0, "epoch": 4, "weight_version": a},
            "output_token_logprobs": [[-0.1 * (k + 1), 100 + k, None] for k in range(8)]}


def test_a_request_crossing_two_publications():
    tv = TokenVersions.from_response({"meta_info": crossing_meta(), "output_ids": list(range(8))})
    assert tv.sampler == (7, 7, 7, 8, 8, 8, 9, 9)                   # integer labels come back as ints
    assert tv.kv_oldest == (7,) * 8
    assert tv.kv_newest == (7, 7, 7, 8, 8, 8, 9, 9)
    assert tv.staleness == (0, 0, 0, 1, 1, 1, 2, 2)
    assert tv.kind == (FRESH,) * 3 + (CROSSING,) * 5
    assert tv.codes == (0, 0, 0, 1, 1, 1, 1, 1) and tv.counts() == {"fresh": 3, "crossing": 5, "stale": 0}
    assert tv.logprobs == pytest.approx([-0.1 * (k + 1) for k in range(8)]) and len(tv) == 8
    assert tv.described and tv.clock_unit == "epoch" and dict(tv.clock) == {7: 4, 8: 5, 9: 6}
    # lag to the trainer's version: by epochs for versions the response holds, by step numbers beyond
    assert tv.lag(9) == [2] * 8 and tv.lag("10") == [3] * 8


def test_a_request_that_never_crossed_is_fresh_and_the_newest_version_is_its_own():
    meta = {"prompt_tokens": 5, "completion_tokens": 3, "weight_version": "v3",
            "prefix_cache": {"cached_tokens": 4, "epoch": 2, "weight_version": "v3"}}
    tv = TokenVersions.from_meta_info(meta)
    assert tv.kind == (FRESH,) * 3 and tv.staleness == (0,) * 3 and tv.sampler == ("v3",) * 3
    assert tv.logprobs is None
    with pytest.raises(ValueError, match="return_logprob"):
        importance_weights(tv, [0.0] * 3)


def test_a_bounded_request_that_reused_older_kv_is_stale_by_its_epochs():
    # admitted at epoch 3 ("vC"), reused 20 positions of epoch 2 ("vB"): the ledger's spans
    meta = {"prompt_tokens": 24, "completion_tokens": 4, "weight_version": "vC",
            "kv_weight_versions": [{"version": "vB", "epoch": 2, "start": 0, "end": 20},
                                   {"version": "vC", "epoch": 3, "start": 20, "end": 28}],
            "prefix_cache": {"cached_tokens": 20, "epoch": 2, "weight_version": "vB"},
            "vradix_staleness": {"max_staleness": 1, "admitted_epoch": 3, "namespace_epoch": 2, "staleness": 1,
                                 "stale_tokens": 20}}
    tv = TokenVersions.from_meta_info(meta)
    assert tv.kind == (STALE,) * 4 and tv.staleness == (1,) * 4
    assert tv.kv_oldest == ("vB",) * 4 and tv.kv_newest == ("vC",) * 4 and tv.sampler == ("vC",) * 4
    assert mask(tv) == [0] * 4 and mask(tv, max_staleness=1) == [1] * 4
    assert mask(tv, trainer_version="vC", max_staleness=1) == [1] * 4
    with pytest.raises(ResponseError, match="integer step labels"):
        tv.lag("vD")                                                  # neither held by the response nor a number


def test_a_retracted_request_re_prefilled_under_the_new_weights_is_fresh():
    # retract pause: tokens 0-1 sampled by v0 before the retraction; re-bound at epoch 1, the whole sequence
    # recomputed there, so vradix reports no crossing spans
    meta = {"prompt_tokens": 6, "completion_tokens": 5, "weight_version": "v1", "num_retractions": 1,
            "weight_versions": [{"version": "v0", "start": 0, "end": 2}, {"version": "v1", "start": 2, "end": 5}],
            "prefix_cache": {"cached_tokens": 6, "epoch": 1, "weight_version": "v1"}}
    tv = TokenVersions.from_meta_info(meta)
    assert tv.kind == (FRESH,) * 5 and tv.staleness == (0,) * 5
    assert tv.sampler == ("v0", "v0", "v1", "v1", "v1") and tv.kv_oldest == tv.sampler
    # the same spans without the retraction would be a crossing request
    crossing = {**meta, "num_retractions": 0, "kv_weight_versions": [
        {"version": "v0", "epoch": 0, "start": 0, "end": 7}, {"version": "v1", "epoch": 1, "start": 7, "end": 11}],
        "prefix_cache": {"cached_tokens": 0, "epoch": 0, "weight_version": "v0"}}
    assert TokenVersions.from_meta_info(crossing).kind == (FRESH,) * 2 + (CROSSING,) * 3


def test_a_stock_response_has_no_stale_tokens_and_orders_versions_by_labels_or_order():
    meta = {"prompt_tokens": 4, "completion_tokens": 4, "weight_version": "2",
            "weight_versions": [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}]}
    tv = TokenVersions.from_meta_info(meta)
    assert not tv.described and tv.clock_unit == "label"
    assert tv.kind == (FRESH, FRESH, CROSSING, CROSSING) and tv.staleness == (0, 0, 1, 1)
    named = {**meta, "weight_version": "b",
             "weight_versions": [{"version": "a", "start": 0, "end": 2}, {"version": "b", "start": 2, "end": 4}]}
    assert TokenVersions.from_meta_info(named).clock_unit == "appearance"
    ordered = TokenVersions.from_meta_info(named, order={"a": 0, "x": 1, "b": 2})
    assert ordered.clock_unit == "order" and ordered.staleness == (0, 0, 2, 2)


def test_the_label_rule():
    assert version("12") == 12 and version(12) == 12 and version(" 3 ") == 3 and version("-1") == -1
    assert version("v2") == "v2" and version("default") == "default" and version("-") == "-"
    with pytest.raises(ResponseError):
        version(True)


def openai_completion(meta, key="metadata", chat=False):
    lps = [x[0] for x in meta["output_token_logprobs"]]
    logprobs = ({"content": [{"token": "t", "logprob": x} for x in lps]} if chat else
                {"tokens": ["t"] * len(lps), "token_logprobs": lps})
    fields = {k: v for k, v in meta.items() if k not in ("prompt_tokens", "completion_tokens",
                                                          "output_token_logprobs", "num_retractions")}
    return {"id": "x", "object": "chat.completion" if chat else "text_completion",
            "choices": [{"index": 0, "logprobs": logprobs, "finish_reason": "length"}],
            "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"]},
            key: fields}


@pytest.mark.parametrize("key,chat", [("metadata", False), ("metadata", True), ("sglext", False)])
def test_openai_completions_and_chat_in_metadata_or_sglext_read_the_same(key, chat):
    native = TokenVersions.from_meta_info(crossing_meta())
    tv = TokenVersions.from_response(openai_completion(crossing_meta(), key, chat))
    assert tv == native


def test_corrections_as_lists_numpy_and_torch():
    tv = TokenVersions.from_meta_info(crossing_meta())
    trainer = [-0.1 * (k + 1) + (0.5 if k == 7 else 0.2) for k in range(8)]   # log(w) = 0.2, and 0.5 on the last
    w = importance_weights(tv, trainer, cap=1.5, kinds=("crossing",))
    assert w == pytest.approx([1.0] * 3 + [math.exp(0.2)] * 4 + [1.5])     # exp(0.5) = 1.65 truncated to 1.5
    assert importance_weights(tv, trainer, cap=1.5) == pytest.approx([math.exp(0.2)] * 7 + [1.5])
    wn = importance_weights(tv, np.asarray(trainer, dtype=np.float32), cap=1.5, kinds=("crossing",))
    assert isinstance(wn, np.ndarray) and wn.dtype == np.float32 and wn.tolist() == pytest.approx(w, rel=1e-6)
    t = torch.tensor(trainer, requires_grad=True)
    wt = importance_weights(tv, t, cap=1.5, kinds=("crossing",))
    assert isinstance(wt, torch.Tensor) and not wt.requires_grad and wt.tolist() == pytest.approx(w, rel=1e-6)
    with pytest.raises(ValueError, match="unknown token kinds"):
        importance_weights(tv, trainer, kinds=("crossed",))
    with pytest.raises(ValueError, match="7 trainer log-probs for 8"):
        importance_weights(tv, trainer[:7])
    assert truncated_weights([0.0], [0.0], cap=2.0) == [1.0]
    assert mask(tv, max_staleness=1) == [1] * 6 + [0] * 2
    assert mask(tv, array="torch").tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert mask(tv, trainer_version=9, max_staleness=2, array="numpy", dtype="bool").tolist() == [True] * 8
    with pytest.raises(ValueError, match="choose from list, numpy, torch"):
        mask(tv, array="jax")
    cols = tv.as_numpy()
    assert cols["sampler"].dtype == np.int64 and cols["staleness"].tolist() == list(tv.staleness)
    assert cols["logprob"].dtype == np.float32 and cols["kind"] == list(tv.kind)
    tt = tv.as_torch()
    assert tt["code"].tolist() == list(tv.codes) and tt["kv_oldest"].tolist() == [7] * 8
    named = TokenVersions.from_meta_info(crossing_meta(("a", "b", "c")))
    assert named.as_numpy()["sampler"].dtype == object and "sampler" not in named.as_torch()


def test_pad_rows_lays_responses_out_as_batch_by_width():
    rows = [[1.0, 2.0], [3.0], []]
    assert pad_rows(rows) == [[1.0, 2.0], [3.0, 0.0], [0.0, 0.0]]
    assert pad_rows(rows, 3, value=1.0, array="torch").tolist() == [[1, 2, 1], [3, 1, 1], [1, 1, 1]]
    assert pad_rows(rows, 2, left=True, array="numpy").tolist() == [[1, 2], [0, 3], [0, 0]]
    with pytest.raises(ValueError, match="does not fit"):
        pad_rows(rows, 1)


def test_bad_input_names_the_alternative():
    with pytest.raises(ResponseError, match="one response at a time"):
        TokenVersions.from_response([{"meta_info": {}}])
    with pytest.raises(ResponseError, match="no 'completion_tokens'"):
        TokenVersions.from_meta_info({"prompt_tokens": 3, "weight_version": "v"})
    with pytest.raises(ResponseError, match="not a /generate response"):
        TokenVersions.from_response({"text": "hi"})
    with pytest.raises(ResponseError, match="is this an SGLang server"):
        TokenVersions.from_response({"choices": [{}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    two = openai_completion(crossing_meta())
    two["choices"].append(two["choices"][0])
    with pytest.raises(ResponseError, match="first choice only"):
        TokenVersions.from_response(two, choice=1)


def test_the_trainer_package_imports_neither_sglang_nor_the_serving_package():
    code = ("import sys, vradix.trainer as t; t.TokenVersions; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch', 'numpy') "
            "or m.startswith(('vradix.hooks', 'vradix.core', 'vradix.engine', 'vradix.scheduler'))); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
