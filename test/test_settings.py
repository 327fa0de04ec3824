"""vradix.settings: every VRADIX_* variable the product reads, its default, its one parser and its one error type,
and docs/settings.md's table agreeing with it."""
import pathlib
import re

import pytest

from vradix import settings

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "python" / "vradix"


def documented() -> dict:
    """docs/settings.md's table: variable -> its default cell."""
    rows = re.findall(r"^\| `(VRADIX_[A-Z_]+)` \| ([^|]+) \|", (ROOT / "docs" / "settings.md").read_text(), re.M)
    return {name: default.strip() for name, default in rows}


def test_the_docs_table_and_settings_agree():
    table = documented()
    assert list(table) == list(settings.SETTINGS)
    assert table == {s.name: f"`{s.default}`" if s.default else "unset" for s in settings.SETTINGS.values()}


def test_every_variable_the_product_names_is_a_setting():
    """Each `VRADIX_*` name written in the product's code is in the table (testing/ only sets them for servers)."""
    names = set()
    for path in PRODUCT.rglob("*.py"):
        if "testing" not in path.relative_to(PRODUCT).parts:
            names |= set(re.findall(r"\bVRADIX_[A-Z_]*[A-Z]\b", path.read_text()))
    assert names <= set(settings.SETTINGS)


def test_defaults():
    assert settings.load({}) == {
        "VRADIX_DISABLE": False, "VRADIX_VERIFY": "strict", "VRADIX_VERIFY_SAMPLE_EVERY": 16,
        "VRADIX_AUDIT": "report", "VRADIX_PREFILL_DEDUP": "on", "VRADIX_WEIGHT_IDENTITY": "auto",
        "VRADIX_MAX_STALENESS": 0, "VRADIX_RECLAIM_SLICE_NODES": 8, "VRADIX_KERNELS": "auto", "VRADIX_CENSUS": False,
        "VRADIX_ALLOW_UNTESTED_SGLANG": False,
        "VRADIX_RAY_CHAINED_SETUP_HOOK": "", "VRADIX_CHAINED_HTTP_SERVER_APP_PATH": "", "VRADIX_API_KEY": "", "VRADIX_FAULT_MISSING_HOOK": "", "VRADIX_FAULT_IMPORT": "",
        "VRADIX_FAULT_NO_NAMESPACE": False}


@pytest.mark.parametrize("name,raw,message", [
    ("VRADIX_VERIFY", "paranoid", "VRADIX_VERIFY='paranoid': expected one of off, sample, strict"),
    ("VRADIX_AUDIT", "fix", "VRADIX_AUDIT='fix': expected one of off, report, repair"),
    ("VRADIX_VERIFY_SAMPLE_EVERY", "0", "VRADIX_VERIFY_SAMPLE_EVERY='0': expected a positive integer"),
    ("VRADIX_VERIFY_SAMPLE_EVERY", "-3", "VRADIX_VERIFY_SAMPLE_EVERY='-3': expected a positive integer"),
    ("VRADIX_PREFILL_DEDUP", "maybe", "VRADIX_PREFILL_DEDUP='maybe': expected one of on, off"),
    ("VRADIX_MAX_STALENESS", "-1", "VRADIX_MAX_STALENESS='-1': expected a non-negative integer"),
    ("VRADIX_WEIGHT_IDENTITY", "Sometimes", "VRADIX_WEIGHT_IDENTITY='Sometimes': expected one of auto, "
                                            "nonce, fingerprint, declared"),
    ("VRADIX_RECLAIM_SLICE_NODES", "lots", "VRADIX_RECLAIM_SLICE_NODES='lots': expected a positive integer"),
    ("VRADIX_KERNELS", "CUDA", "VRADIX_KERNELS='CUDA': expected one of auto, cuda, triton, torch"),
])
def test_a_bad_value_raises_the_one_error_naming_the_variable(name, raw, message):
    with pytest.raises(settings.SettingsError) as e:
        settings.value(name, {name: raw})
    assert str(e.value) == message
    with pytest.raises(settings.SettingsError, match=name):
        settings.load({name: raw})


@pytest.mark.parametrize("name,raw,parsed", [
    ("VRADIX_VERIFY", " Sample ", "sample"), ("VRADIX_AUDIT", "REPAIR", "repair"),
    ("VRADIX_VERIFY_SAMPLE_EVERY", " 4 ", 4), ("VRADIX_PREFILL_DEDUP", "OFF", "off"),
    ("VRADIX_WEIGHT_IDENTITY", "", "auto"), ("VRADIX_WEIGHT_IDENTITY", "NONCE", "nonce"), ("VRADIX_WEIGHT_IDENTITY", "Fingerprint", "fingerprint"),
    ("VRADIX_DISABLE", "Yes", True), ("VRADIX_DISABLE", "0", False),
    ("VRADIX_ALLOW_UNTESTED_SGLANG", "1", True), ("VRADIX_ALLOW_UNTESTED_SGLANG", "yes", False),
    ("VRADIX_FAULT_NO_NAMESPACE", "1", True), ("VRADIX_FAULT_IMPORT", "x", "x"),
])
def test_accepted_values(name, raw, parsed):
    assert settings.value(name, {name: raw}) == parsed


def test_the_process_environment_is_read_when_asked(monkeypatch):
    monkeypatch.setenv("VRADIX_AUDIT", "off")
    assert settings.value("VRADIX_AUDIT") == "off"
    monkeypatch.delenv("VRADIX_AUDIT")
    assert settings.value("VRADIX_AUDIT") == "report"


def test_the_install_refuses_a_bad_setting(monkeypatch):
    from vradix import plugin

    monkeypatch.setenv("VRADIX_KERNELS", "fastest")
    with pytest.raises(plugin.VradixInstallError, match="VRADIX_KERNELS='fastest'"):
        plugin._install()
