"""The docs stay true and self-contained (issue: hardening, item 9): the hook table in docs/design.md is the one
generated from `vradix.hooks.HOOKS`, no hand-written hook count survives, and nothing in the repository's docs points
at a path outside the repository."""
import importlib.util
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOCS = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", f) for f in
                                            sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md")]


def load_hook_table():
    spec = importlib.util.spec_from_file_location("hook_table", os.path.join(ROOT, "scripts", "hook_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_design_doc_hook_table_is_generated_from_hooks():
    ht = load_hook_table()
    with open(ht.DESIGN) as f:
        text = f.read()
    assert ht.refreshed(text) == text, "docs/design.md is stale: run `.venv/bin/python scripts/hook_table.py --write`"


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_no_hand_written_hook_count(path):
    with open(path) as f:
        text = f.read()
    text = re.sub(r"<!-- hooks:begin.*?<!-- hooks:end -->", "", text, flags=re.S)
    assert not re.search(r"\b\d+ (hooks|targets)\b", text), "state hook counts only in the generated table"


@pytest.mark.parametrize("path", DOCS + [os.path.join(ROOT, "docs", "data", "rl_rollout_cpu.json")],
                         ids=os.path.basename)
def test_no_path_outside_the_repository(path):
    with open(path) as f:
        text = f.read()
    for outside in ("/tmp/", "/work/", "../shared", "shared/reference", "shared/context", "/root/"):
        assert outside not in text, f"{os.path.basename(path)} refers to {outside!r}, outside the repository"
