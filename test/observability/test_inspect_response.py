"""`vradix inspect --response FILE`: a saved response's per-token weight versions, read by `vradix.trainer`, printed
as runs of tokens that share them; `--json` gives the per-token columns; a file that is no response exits 1 and
names why. Client side, no server (a live server's response is inspected in `test_e2e_provenance.py`)."""
import json

import pytest

from vradix import cli
from vradix.trainer import TokenVersions


def crossing_meta() -> dict:
    """A 12-token prompt and 9 output tokens sampled by steps 4, 5 and 6 (3 each), the KV spans to match: the
    request crossed two publications."""
    return {"prompt_tokens": 12, "completion_tokens": 9, "weight_version": "6", "num_retractions": 0,
            "weight_versions": [{"version": "4", "start": 0, "end": 3}, {"version": "5", "start": 3, "end": 6},
                                {"version": "6", "start": 6, "end": 9}],
            "kv_weight_versions": [{"version": "4", "weight_id": "a", "epoch": 10, "start": 0, "end": 14},
                                   {"version": "5", "weight_id": "b", "epoch": 11, "start": 14, "end": 17},
                                   {"version": "6", "weight_id": "c", "epoch": 12, "start": 17, "end": 21}],
            "prefix_cache": {"cached_tokens": 0, "epoch": 10, "weight_version": "4", "weight_id": "a"}}


def run(argv, capsys) -> tuple:
    status = cli.main(["inspect", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_crossing_response_prints_one_row_per_run_of_equal_versions(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"output_ids": list(range(9)), "meta_info": crossing_meta()}))
    status, out, err = run(["--response", str(path)], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "9 output tokens after a 12-token prompt: 3 fresh, 6 crossing, 0 stale"
    rows = [line.split() for line in lines[2:]]
    assert rows == [["0-2", "4", "4", "0", "fresh"], ["3-5", "5", "4", "..", "5", "1", "crossing"],
                    ["6-8", "6", "4", "..", "6", "2", "crossing"]], out


def test_json_gives_the_per_token_columns_of_every_response_of_a_batch(tmp_path, capsys):
    path = tmp_path / "batch.json"
    plain = {**crossing_meta(), "weight_versions": [{"version": "6", "start": 0, "end": 9}],
             "prefix_cache": {"cached_tokens": 0, "epoch": 12, "weight_version": "6", "weight_id": "c"}}
    del plain["kv_weight_versions"]  # vradix leaves them out for a request that crossed nothing
    path.write_text(json.dumps([{"meta_info": crossing_meta()}, {"meta_info": plain}]))
    status, out, err = run(["--response", str(path), "--json"], capsys)
    assert status == 0, err
    first, second = json.loads(out)
    assert first["kind"] == TokenVersions.from_meta_info(crossing_meta()).columns()["kind"]
    assert first["staleness"] == [0] * 3 + [1] * 3 + [2] * 3 and first["prompt_tokens"] == 12
    assert second["kind"] == ["fresh"] * 9 and second["sampler"] == [6] * 9


@pytest.mark.parametrize("content, why", [("not json", "neither JSON"), ('{"text": "hi"}', "no per-token versions")])
def test_a_file_that_is_no_response_exits_1_and_says_why(tmp_path, capsys, content, why):
    path = tmp_path / "bad.json"
    path.write_text(content)
    status, out, err = run(["--response", str(path)], capsys)
    assert status == 1 and out == "" and why in err, err


def test_url_and_response_are_one_or_the_other(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["inspect", "--url", "http://127.0.0.1:1", "--response", "-"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err
