"""docs/paths.md is the half of the closed world written by reading SGLang (docs/coverage.md is the contract), and
this module holds it to its word.

- every row has a known class, and every test a row names exists (file and function, read with `ast`); at least
  one of them runs in `make test` (is not marked `long`);
- a "versioned", "refused" or "stock changed" row names at least one test;
- every "refused at launch" row's flag stops SGLang's own argument check (`ServerArgs.check_server_args`, which the
  launcher runs before any scheduler starts) with vradix's `UnversionedPathError` naming the flag, and every
  `vradix.closed_world.unversioned.REFUSALS` entry has its row;
- the rows marked `open` are exactly `KNOWN_OPEN` (a new open row, or a closed one left here, fails).
"""
import json
import pathlib
import re
import shutil
import types

import pytest

from vradix.closed_world import unversioned
from vradix.testing.harness.suite import find_test_file, functions_in, is_long_test

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATHS = ROOT / "docs" / "paths.md"
CLASSES = ("versioned", "refused at launch", "refused at engine start", "refused at update", "no stale reuse",
            "stock changed", "open")
NEEDS_TEST = ("versioned", "refused at launch", "refused at engine start", "refused at update", "stock changed")

#: rows not closed yet (docs/paths.md "Open"): none; a row marked `open` again fails until it is named here
KNOWN_OPEN: set = set()

#: launch flags, besides the refused one, that SGLang's own checks need before vradix's check runs
LAUNCH_CONTEXT = {
    "pd-role-switch": ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake_tcp",
                       "--vradix-weight-identity", "fingerprint"],
    "spec-relaxed-accept": ["--speculative-algorithm", "NGRAM"],
    "offload-meta": ["--offload-group-size", "2"],
    "routed-experts-capture": ["--enable-hierarchical-cache", "--hicache-io-backend", "direct",
                               "--hicache-mem-layout", "layer_first"],
    "radix-off-streaming-session": ["--disable-radix-cache"],
    "l3-streaming-session": ["--enable-hierarchical-cache", "--hicache-storage-backend", "file",
                             "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"],
    "pd-decode-session": ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake_tcp",
                          "--disaggregation-decode-enable-radix-cache", "--vradix-weight-identity", "fingerprint"],
    "pd-decode-radix-off": ["--disaggregation-transfer-backend", "mooncake_tcp", "--vradix-weight-identity",
                            "fingerprint"],
}
#: rows whose flag SGLang accepts only for a vision-language model
NEEDS_VL_MODEL = {"epd-encoder", "epd-language", "epd-global-store"}
#: rows whose flag SGLang accepts only for a diffusion-LLM architecture
NEEDS_DLLM_MODEL = {"dllm"}
#: the value a refused flag is given at launch (a bare flag is a switch)
FLAG_VALUE = {"radix-backend": ["foo"], "spec-relaxed-accept": ["0.5"], "offload-meta": ["meta"],
              "elastic-ep": ["mooncake"], "dllm": ["LowConfidence"], "pd-decode-radix-off": ["decode"],
              "kt-cpu-experts": ["/nonexistent/kt-experts"], "loop-pp": ["2"]}
#: the value a refused environment setting is given at launch (a number above 0 unless named here)
ENV_VALUE = {"rust-server": "1", "dspark-fp8-lm-head": "1", "swiglu-interleaved": "1", "dsv4-dense-mxscale": "1",
             "hisparse-skip-io": "1", "external-model": "a_model_package"}


def rows() -> list[dict]:
    """The table rows of docs/paths.md as dicts keyed by the header's columns."""
    table = PATHS.read_text().split("\n## Open\n")[0]
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        assert len(cells) == len(header), f"malformed row: {ln[:80]}"
        out.append(dict(zip(header, cells)))
    return out


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    from vradix.testing.models.vl import generate
    return generate(str(tmp_path_factory.mktemp("vl") / "A"), seed=1)


@pytest.fixture(scope="module")
def dllm_model(models, tmp_path_factory):
    """The tiny Llama checkpoint declared as SDAR, a block-diffusion architecture SGLang's dLLM config knows (the
    argument pipeline reads only the config)."""
    path = tmp_path_factory.mktemp("dllm") / "sdar"
    shutil.copytree(models[0], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["SDARForCausalLM"]}))
    return str(path)


ROWS = rows()
ROW = {r["id"]: r for r in ROWS}


def named_tests(row) -> list[str]:
    return re.findall(r"`([\w/]+\.py::\w+)`", row["tests"])


def test_every_row_has_a_class_and_its_tests_exist():
    assert len(ROW) == len(ROWS), "row ids must be unique"
    problems = []
    for r in ROWS:
        if r["class"] not in CLASSES:
            problems.append(f"{r['id']}: unknown class {r['class']!r}")
        if r["class"] in NEEDS_TEST and not named_tests(r):
            problems.append(f"{r['id']}: a {r['class']} row must name its test")
        for node in named_tests(r):
            file, name = node.split("::")
            path = find_test_file(file)
            if path is None or name not in functions_in(path):
                problems.append(f"{r['id']}: names {node}, which does not exist")
        if named_tests(r) and all(is_long_test(node) for node in named_tests(r)):
            problems.append(f"{r['id']}: every test it names is `long`: `make test` (CI) would not cover it")
    assert not problems, "\n".join(problems)


def test_long_tests_are_told_from_ci_tests():
    """The check above reads the marks as pytest does: on the function, or on the whole module (`pytestmark`)."""
    assert is_long_test("test_soak.py::test_short_publication_soak")  # the module's pytestmark
    assert is_long_test("test_fault_injection.py::test_on_hicache")  # the function's decorator
    assert not is_long_test("test_fault_injection.py::test_publication_during_chunked_prefill")


def test_the_open_rows_are_the_known_ones():
    assert {r["id"] for r in ROWS if r["class"] == "open"} == KNOWN_OPEN


def refused_at_launch() -> list[str]:
    return [r["id"] for r in ROWS if r["class"] == "refused at launch"]


def flag_of(row_id: str) -> str:
    """The first backticked `--flag` (or `ENV_VAR`) in the row's "turned on by" cell."""
    return re.search(r"`(--[\w-]+|[A-Z][A-Z0-9_]+)", ROW[row_id]["turned on by"]).group(1)


def test_every_refusal_has_its_row():
    from vradix.closed_world import epd
    flags = {flag_of(i) for i in refused_at_launch()}
    refused = {r.flag.split()[0].split("/")[0] for r in unversioned.REFUSALS} | {f for _, f in epd.EPD_FLAGS}
    assert refused <= flags


@pytest.mark.parametrize("row_id", refused_at_launch())
def test_a_refused_flag_stops_the_launch(row_id, models, vl_model, dllm_model, monkeypatch):
    """SGLang's own parser and argument check with the row's flag: vradix's refusal names the flag; without it the
    same launch passes the check (so the refusal, not another error, is what stops it)."""
    from sglang.srt.server_args import prepare_server_args
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    model = vl_model if row_id in NEEDS_VL_MODEL else dllm_model if row_id in NEEDS_DLLM_MODEL else models[0]
    base = ["--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
            "--skip-tokenizer-init"] + LAUNCH_CONTEXT.get(row_id, [])
    flag = flag_of(row_id)

    def check(argv):
        args = prepare_server_args(argv)
        args.resolve_once()
        args.check_server_args()

    if flag.startswith("--"):
        refused = base + [flag] + FLAG_VALUE.get(row_id, [])
    else:  # an environment setting
        monkeypatch.setenv(flag, ENV_VALUE.get(row_id, "2"))
        refused = base
    with pytest.raises(unversioned.UnversionedPathError, match=re.escape(flag)):
        check(refused)
    monkeypatch.delenv(flag, raising=False)
    check(base)


@pytest.mark.parametrize("row_id", refused_at_launch())
def test_a_refused_flag_stops_the_engine_start_too(row_id, models, vl_model, dllm_model, monkeypatch):
    """The same launch with the launcher's check skipped (SGLang's parser and resolution only, as a frontend that
    never runs `check_server_args` would start it): the scheduler refuses it in `Scheduler.__init__` before it
    builds anything, with the same error naming the flag."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.server_args import prepare_server_args
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    model = vl_model if row_id in NEEDS_VL_MODEL else dllm_model if row_id in NEEDS_DLLM_MODEL else models[0]
    argv = ["--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
            "--skip-tokenizer-init"] + LAUNCH_CONTEXT.get(row_id, [])
    flag = flag_of(row_id)
    if flag.startswith("--"):
        argv += [flag] + FLAG_VALUE.get(row_id, [])
    else:  # an environment setting
        monkeypatch.setenv(flag, ENV_VALUE.get(row_id, "2"))
    args = prepare_server_args(argv)
    args.resolve_once()
    with pytest.raises(unversioned.UnversionedPathError, match=re.escape(flag)):
        Scheduler.__new__(Scheduler).__init__(args, None)  # no port args: past vradix's rules it would fail on them


def test_a_prefix_cache_without_a_tree_core_is_refused_at_engine_start():
    """The scheduler-start refusal (`hooks.startup.attach_to_scheduler`) on SGLang's real RadixCache, the class
    FlexKV's and the pure-SWA caches extend: the engine does not start and the error says what to use instead."""
    from sglang.srt.mem_cache.radix_cache import RadixCache

    from vradix.hooks.startup import attach_to_scheduler
    from vradix.testing.harness.cache_fixture import build_cache
    cache = RadixCache(build_cache().cache.cache_init_params)
    assert cache.supports_prefix_sharing()
    with pytest.raises(RuntimeError, match="cannot version RadixCache.*--disable-radix-cache"):
        attach_to_scheduler(None, types.SimpleNamespace(tree_cache=cache))


def test_storage_keys_of_two_weight_identities_never_collide():
    """External stores (the cache linker, HiCache L3) key pages with SGLang's `get_storage_hash_str`, seeded by the
    request's `extra_key`: the same tokens stamped under two weight identities give disjoint page keys, and the same
    identity gives the same keys (what lets an equal identity reuse storage)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    from vradix import identity
    tokens = list(range(100, 164))

    def keys(weight_id):
        return get_storage_hash_str(RadixKey(tokens, identity.stamped(identity.namespace(weight_id), None)),
                                    page_size=16)

    a, b = keys("fp:aaaa"), keys("fp:bbbb")
    assert len(a) == len(b) == 4
    assert not set(a) & set(b)
    assert keys("fp:aaaa") == a
