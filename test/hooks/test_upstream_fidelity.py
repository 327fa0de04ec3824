"""Upstream fidelity at the launcher: SGLang's `--enable-prefill-weight-versions` is accepted on 0.5.23 (so miles'
`--sglang-enable-prefill-weight-versions` check passes), an SGLang that has the field natively keeps the only copy,
and the meta_info / OpenAI builders put the fields where SGLang puts its own. SGLang's real parser, `ServerArgs`,
`prepare_server_args` and the real hook bodies; no server."""
import argparse
import dataclasses

import msgspec
import pytest
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.utils.weight_versions import build_endpoint_weight_version_metadata

from vradix.core import provenance
from vradix.hooks import launcher, report

FLAG = "--enable-prefill-weight-versions"


def test_an_engine_launched_with_the_upstream_flag_starts(models):
    """SGLang 0.5.23's own parser has no such flag; with vradix the launch parses (it changes nothing: vradix
    reports `prefill_weight_versions` on every response)."""
    args = prepare_server_args(["--model-path", models[0], FLAG])
    assert args.model_path == models[0]
    assert prepare_server_args(["--model-path", models[0]]).model_path == models[0]


def miles_sglang_parser(server_args_cls=ServerArgs) -> argparse.ArgumentParser:
    """What miles' `add_sglang_arguments` does: call `ServerArgs.add_cli_args` with `add_argument` wrapped so every
    flag is registered as `--sglang-<flag>` (dest `sglang_<name>`), skipping the fields miles sets itself. miles treats
    a flag `add_cli_args` registered as supported, and registers its own fallback (which refuses `True`) otherwise."""
    parser = argparse.ArgumentParser()
    real = parser.add_argument

    def prefixed(*flags, **kwargs):
        if any(f in ("--model-path", "--port") for f in flags):
            return None
        if "dest" in kwargs:
            kwargs["dest"] = "sglang_" + kwargs["dest"]
        return real(*[f"--sglang-{f.lstrip('-')}" if f.startswith("-") else f for f in flags], **kwargs)

    parser.add_argument = prefixed  # type: ignore[method-assign]
    try:
        server_args_cls.add_cli_args(parser)
    finally:
        parser.add_argument = real  # type: ignore[method-assign]
    return parser


def test_miles_switch_finds_the_upstream_flag_on_sglang_0_5_23():
    parser = miles_sglang_parser()
    assert "--sglang-enable-prefill-weight-versions" in parser._option_string_actions  # no miles fallback
    assert parser.parse_args(["--sglang-enable-prefill-weight-versions"]).sglang_enable_prefill_weight_versions
    assert not parser.parse_args([]).sglang_enable_prefill_weight_versions


def test_an_sglang_with_its_own_flag_keeps_it():
    """On an SGLang whose parser already has the flag (after 0.5.23), vradix's hook adds no second one and leaves
    SGLang's definition in place."""
    parser = argparse.ArgumentParser()
    own = parser.add_argument(FLAG, action="store_true", help="SGLang's own")
    launcher.add_identity_flag(None, parser)
    assert parser._option_string_actions[FLAG] is own
    assert parser.parse_args([FLAG]).enable_prefill_weight_versions


def test_a_native_prefill_weight_versions_field_is_detected_from_server_args():
    """`sglang_emits`: SGLang 0.5.23 emits none of upstream's prefill spans; an SGLang whose `ServerArgs` has upstream's
    `enable_prefill_weight_versions` field (planted here, as a msgspec struct like 0.5.23's and as a dataclass like
    earlier releases') emits its own."""
    assert report.sglang_emits(ServerArgs) == frozenset() == report.native_fields()
    planted = msgspec.defstruct("ServerArgs", [("model_path", str), ("enable_prefill_weight_versions", bool, False)])
    assert report.sglang_emits(planted) == {"prefill_weight_versions"}

    @dataclasses.dataclass
    class OlderServerArgs:
        enable_prefill_weight_versions: bool = False

    assert report.sglang_emits(OlderServerArgs) == {"prefill_weight_versions"}


INFO = {"prefix_cache": {"cached_tokens": 0, "epoch": 0, "weight_version": "7", "weight_id": "nonce:1"},
        "prefill_weight_versions": [{"version": "7", "start": 0, "end": 5}],
        "first_prefill_weight_version": 7, "min_forward_weight_version": 7, "max_forward_weight_version": 8,
        "last_forward_weight_version": 8}


def sglang_meta_info():
    """meta_info as SGLang 0.5.23 has built it when `update_request_meta_info` runs: its own per-output spans."""
    return {"completion_tokens": 3, "cached_tokens": 0, "weight_version": "8",
            "weight_versions": [{"version": "7", "start": 0, "end": 1}, {"version": "8", "start": 1, "end": 3}]}


def through_the_hook(meta_info):
    rest = []
    report.provenance_to_meta_info(lambda *a: rest.append(a), None, meta_info, None,
                                   {provenance.PROVENANCE_KEY: [INFO]}, 0)
    assert rest == []  # nothing else in customized_info: SGLang's own handler has nothing to do
    return meta_info


def test_meta_info_gets_upstream_and_miles_fields_next_to_sglangs_own():
    meta = through_the_hook(sglang_meta_info())
    assert meta["prefill_weight_versions"] == INFO["prefill_weight_versions"]
    assert (meta["first_prefill_weight_version"], meta["last_forward_weight_version"]) == (7, 8)
    assert meta["response_weight_version"] == "8" == meta["weight_version"]
    assert meta["response_weight_version_segments"] == [[0, 1, 7], [1, 3, 8]]
    assert meta["weight_versions"] == sglang_meta_info()["weight_versions"]  # SGLang's own, untouched


def test_a_field_sglang_already_produced_is_the_only_copy():
    """A natively produced field (planted in meta_info, as an SGLang with the feature fills it) is never replaced by
    vradix's; on a host whose `ServerArgs` has the native field, vradix emits no `prefill_weight_versions` at all."""
    native = [{"version": "7", "start": 0, "end": 2}, {"version": "unknown", "start": 2, "end": 5}]
    meta = sglang_meta_info()
    meta["prefill_weight_versions"] = native
    meta["response_weight_version_segments"] = [[0, 3, 8]]
    report.add_to_meta_info(meta, INFO, frozenset())
    assert meta["prefill_weight_versions"] is native and meta["response_weight_version_segments"] == [[0, 3, 8]]
    meta = sglang_meta_info()
    report.add_to_meta_info(meta, INFO, frozenset({"prefill_weight_versions"}))
    assert "prefill_weight_versions" not in meta and meta["first_prefill_weight_version"] == 7


def test_openai_responses_carry_them_where_sglang_puts_its_own_weight_versions():
    """SGLang 0.5.23 puts `weight_version(s)` in the OpenAI response's `metadata` (its builder); vradix's fields go
    into the same block (later upstream moves them to `sglext`: the block follows the host's builder)."""
    meta = through_the_hook(sglang_meta_info())
    metadata = report.provenance_to_openai_metadata(build_endpoint_weight_version_metadata(meta), meta)
    assert metadata["weight_versions"] == meta["weight_versions"]
    for key in ("prefill_weight_versions", "first_prefill_weight_version", "response_weight_version_segments"):
        assert metadata[key] == meta[key], key


@pytest.mark.parametrize("bad", [[{"version": "v1", "start": 0, "end": 0}], None, []])
def test_no_output_means_no_response_fields(bad):
    meta = {"completion_tokens": 0, "weight_version": "v1", "weight_versions": bad}
    report.add_to_meta_info(meta, INFO, frozenset())
    assert "response_weight_version" not in meta and "response_weight_version_segments" not in meta


TRAINER_PROCESS = """
import argparse, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
import vradix.plugin
print("plugins loaded:", vradix.plugin.installed(), "flag:", "--enable-prefill-weight-versions" in parser._option_string_actions)
"""


@pytest.mark.parametrize("disable, registered", [("0", True), ("1", False)], ids=["vradix", "disabled"])
def test_a_trainer_process_that_never_loads_plugins_finds_the_flag(disable, registered):
    """miles parses SGLang's arguments in the trainer, where SGLang never calls `load_plugins()`: the environment's
    .pth (`vradix.startup`) registers the flag when `sglang.srt.server_args` is imported, so miles' switch passes
    there too; with VRADIX_DISABLE=1 it does not (stock SGLang 0.5.23: miles fails loudly, as it should)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "VRADIX_DISABLE": disable}
    env.pop("SGLANG_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", TRAINER_PROCESS], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"plugins loaded: False flag: {registered}" in out.stdout, out.stdout + out.stderr[-2000:]
