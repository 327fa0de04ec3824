"""The docs stay true and self-contained: the hook table in docs/design.md is the one generated from
`vradix.hooks.HOOKS`, no hand-written hook count survives, nothing in the repository's docs points at a path outside
the repository, docs/README.md indexes every page, every relative link resolves, and every repository path and test id
the docs name exists."""
import importlib.util
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DOCS_DIR = os.path.join(ROOT, "docs")
PAGES = sorted(f for f in os.listdir(DOCS_DIR) if f.endswith(".md"))
DOCS = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")] + [os.path.join(DOCS_DIR, f) for f in PAGES]
#: a markdown link's target: `[text](target)`
LINK = re.compile(r"\]\(([^)\s]+)\)")
#: a path inside the repository, as the docs write it (`vradix/...` is short for `python/vradix/...`)
REPO_PATH = re.compile(r"(?<![\w./$-])((?:python|vradix|test|benchmark|scripts|csrc|docs)/[\w./-]*\w)")
#: a pytest id: `test_file.py::test_name`
TEST_ID = re.compile(r"\b(test_\w+\.py)::(test_\w+)")


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


def test_every_hook_the_table_names_is_a_function_of_its_module():
    """The table prints `module.name` of each hook: that name is the hook itself in that module (no renamed
    closure stands for a function nobody can find)."""
    import importlib

    from vradix.hooks import HOOKS

    missing = [f"{hook.__module__}.{hook.__name__}" for _, _, hook in HOOKS
               if getattr(importlib.import_module(hook.__module__), hook.__name__, None) is not hook]
    assert not missing, missing


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


def read(path):
    with open(path) as f:
        return f.read()


def without_fenced_code(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def code_of(text):
    """The inline code spans and fenced code blocks of a page: where the docs write paths and commands."""
    fenced = re.findall(r"^```.*?^```", text, flags=re.S | re.M)
    return fenced + re.findall(r"`([^`\n]+)`", without_fenced_code(text))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(path):
    seen = {}
    for m in re.finditer(r"^#{1,6} (.*)$", without_fenced_code(read(path)), flags=re.M):
        s = slug(m.group(1))
        seen[s] = seen.get(s, -1) + 1
        yield s if seen[s] == 0 else f"{s}-{seen[s]}"


def test_the_index_links_every_page():
    linked = {t.partition("#")[0] for t in LINK.findall(read(os.path.join(DOCS_DIR, "README.md")))}
    missing = [p for p in PAGES if p != "README.md" and p not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_relative_link_resolves(path):
    bad = []
    for target in LINK.findall(without_fenced_code(read(path))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.exists(resolved):
            bad.append(f"{target}: no such file")
        elif anchor and resolved.endswith(".md") and anchor not in set(anchors_of(resolved)):
            bad.append(f"{target}: no such heading")
    assert not bad, bad


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_repository_path_the_docs_name_exists(path):
    bad = []
    for code in code_of(read(path)):
        for p in REPO_PATH.findall(code):
            if not any(os.path.exists(os.path.join(ROOT, base, p)) for base in ("", "python")):
                bad.append(p)
    assert not bad, f"paths that do not exist: {sorted(set(bad))}"


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_every_test_id_the_docs_name_exists(path):
    tests = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "test")):
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                tests[f] = read(os.path.join(folder, f))
    bad = [f"{f}::{t}" for f, t in TEST_ID.findall(read(path))
           if f not in tests or not re.search(rf"^\s*def {t}\(", tests[f], re.M)]
    assert not bad, f"test ids that do not exist: {bad}"


#: an issue reference: `#123`, `project#123`, `project #123`, `issue 12`
ISSUE_REF = re.compile(r"(?:(\b[A-Za-z][\w.-]*) ?)?#(\d{2,5})\b|\bissues? (?:#|no\.? ?)?\d+\b", re.I)
#: projects whose public issues the docs may cite as the upstream bug a feature answers (`sglang #26792`)
UPSTREAM = {"sglang", "vllm", "miles", "reef"}
#: the files that speak of the product: the docs, the tests and the benchmarks
PRODUCT_TEXT = DOCS + sorted(os.path.join(folder, f) for top in ("test", "benchmark")
                             for folder, _, files in os.walk(os.path.join(ROOT, top))
                             for f in files if f.endswith((".py", ".md", ".sh"))
                             and f != os.path.basename(__file__))  # this file holds the check's own examples


def internal_issue_refs(text) -> list:
    """The issue references in `text` that do not name an upstream project: this repository's own history."""
    return [m.group(0) for m in ISSUE_REF.finditer(text)
            if not (m.group(1) and m.group(1).lower() in UPSTREAM and m.group(2))]


def test_no_issue_numbers_in_docs_tests_or_benchmarks():
    """Docs, tests and benchmarks speak of the product, not of the issues or sessions it was built in: the only
    issue numbers they name are upstream bugs (`sglang #26792`)."""
    bad = {os.path.relpath(p, ROOT): refs for p in PRODUCT_TEXT if (refs := internal_issue_refs(read(p)))}
    assert not bad, f"issue references (say what the product does instead): {bad}"


def test_the_issue_reference_check_tells_upstream_from_internal():
    assert internal_issue_refs("the sglang #26792 bug, the miles#2782 recipe, colour #999999") == []
    assert internal_issue_refs("fixed in #42; see issue 7 and prompt #15") == ["in #42", "issue 7", "prompt #15"]
