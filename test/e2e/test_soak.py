"""The publication soak (`benchmark/server/soak_publications.py`), short: 30 publications under concurrent load with
shared prefixes; every response that did not cross a publication must equal the oracle of its label's weights."""
import importlib.util
import os
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(1200)]  # a soak is a long profile


def load_soak():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "server", "soak_publications.py")
    spec = importlib.util.spec_from_file_location("soak_publications", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_short_publication_soak(tmp_path):
    s = load_soak().main(["--publications", "30", "--concurrency", "3", "--suffixes", "10",
                          "--leak-check-every", "10", "--unpaused-every", "7", "--workdir", str(tmp_path)])
    assert s["error_list"] == []
    assert s["publications"] == 30 and s["server_publications"] == 30
    assert s["stale_hits"] == 0
    assert s["leak_checks_passed"] == 3
    assert s["checked_vs_oracle"] >= 30, s  # enough responses outside pause intervals to mean something
    assert s["prefix_hit_share"] > 0  # the load really shares prefixes
