"""The trainer recipes of docs/recipes.md (slime / miles, verl, AReaL) run as written (`vradix.testing.harness.recipes`)
on a response in the shape the server writes for a request crossing two publications with step labels, in each
framework's data shapes. The same recipes run on a live server's response in
`test_e2e_provenance.py::test_trainer_api_and_recipes_on_a_request_crossing_two_step_publications`."""
import pytest

from vradix.testing.harness import recipes


def crossing_response():
    """A 12-token prompt, 9 output tokens: 3 sampled by step 4, 3 by step 5, 3 by step 6, KV spans to match."""
    meta = {"prompt_tokens": 12, "completion_tokens": 9, "weight_version": "6", "num_retractions": 0,
            "weight_versions": [{"version": "4", "start": 0, "end": 3}, {"version": "5", "start": 3, "end": 6},
                                {"version": "6", "start": 6, "end": 9}],
            "kv_weight_versions": [{"version": "4", "weight_id": "a", "epoch": 10, "start": 0, "end": 14},
                                   {"version": "5", "weight_id": "b", "epoch": 11, "start": 14, "end": 17},
                                   {"version": "6", "weight_id": "c", "epoch": 12, "start": 17, "end": 21}],
            "prefix_cache": {"cached_tokens": 0, "epoch": 10, "weight_version": "4", "weight_id": "a"},
            "output_token_logprobs": [[-0.05 * (k + 1), 200 + k, None] for k in range(9)]}
    return {"text": "", "output_ids": [200 + k for k in range(9)], "meta_info": meta}


def test_the_docs_hold_the_three_recipes():
    assert set(recipes.blocks()) == {"miles", "verl", "areal"}
    with pytest.raises(KeyError, match="has no recipe"):
        recipes.load("openrlhf")


@pytest.mark.parametrize("trainer_version,max_staleness", [(6, 1), (7, 1), (6, 0), (8, 3)])
def test_every_trainer_recipe_runs_on_a_crossing_response(trainer_version, max_staleness):
    out = recipes.check_all(crossing_response(), list(range(12)), trainer_version, max_staleness)
    tv = out["tv"]
    assert tv.kind == ("fresh",) * 3 + ("crossing",) * 6 and tv.staleness == (0,) * 3 + (1,) * 3 + (2,) * 3
    # every token read step 4's KV: the trainer at step 6 keeps them with a bound of 2, not of 1
    lag = trainer_version - 4
    assert out["verl"].batch["response_mask"][0, :9].tolist() == [1 if lag <= max_staleness else 0] * 9
    assert out["miles"].loss_mask == [1] * 3 + [1 if max_staleness >= 1 else 0] * 3 + [1 if max_staleness >= 2 else 0] * 3
