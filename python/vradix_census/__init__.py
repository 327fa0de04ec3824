"""The census: the closed world taken from SGLang's live objects, not from a list written by reading it.

A separate top-level package, not part of the vradix wheel: the plugin never imports it unless the escape watch
(`VRADIX_CENSUS=1`, `vradix_census.watch`) is asked for. The tables import vradix's runtime rules (the launch
refusals of `vradix.closed_world.unversioned`, `vradix.closed_world.epd`, ...), never the other way.

Each census table maps a name SGLang has (a request type its scheduler dispatches, an HTTP route, a `ServerArgs`
field, an environment setting, ...) to an `Entry` that classifies it. A table module (`control`, `environ`, `flags`)
offers, per table, an `enumerate_*()` that reads SGLang 0.5.23's live objects and the table itself; the tests assert
`unclassified(table, live)` and `vanished(table, live)` are empty, so an entry SGLang adds fails until it is
classified, and an entry SGLang drops fails until its row goes.

Each table module's page under docs/census/ (`DOC`) embeds its tables as generated blocks between
`<!-- census:NAME -->` and `<!-- /census:NAME -->` (`render_table`); `python -m vradix_census --write` regenerates
them and the tests check them. docs/coverage.md states the contract and links the pages.

Invariants: every entry's class is one of `CLASSES`; an entry whose class needs proof names its tests as
`file.py::function` (checked to exist by the tests); a `refused` entry names the alternative its error names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

#: class -> what it means (rendered under each table)
CLASSES = {
    "publication": "changes the weights (or their label): bumps the epoch exactly once",
    "generation control": "pauses, resumes or aborts generation; its behaviour inside a pause and inside a "
                          "bucketed update is stated and tested",
    "versioned": "carries weight-derived state or KV that vradix versions; its tests prove it",
    "read-only": "reads state and changes nothing a later response is computed from",
    "irrelevant": "cannot carry cached or weight-derived state into a response (the reason says why)",
    "refused": "does not start, or the call is refused; the error names the alternative",
    "re-checked": "a runtime change checked like a launch where the scheduler receives it (what the launch refuses is "
                  "refused, nothing changed) and what startup derived is derived again",
    # the process census (`processes`)
    "vradix present": "a process where vradix's hooks are installed (a test finds them there), or it does not start",
    "not needed": "a process that handles no request, control call or output vradix acts on (the reason says why)",
}
#: classes whose entries must name the tests that prove them
NEEDS_TEST = ("publication", "generation control", "versioned", "refused", "re-checked", "vradix present")
#: modules of this package that hold census tables; each defines `TABLES`: {block name: (title, enumerate, table)},
#: where `enumerate()` returns the names SGLang has now, `DOC`, the page under docs/ its blocks are embedded in
#: (`doc_of`), and may define `EXTRA_BLOCKS`: {block name: render()}
TABLE_MODULES = ("control", "environ", "flags", "processes", "runtime")


@dataclass(frozen=True)
class Entry:
    """One classified census entry: its class (one of `CLASSES`) and why. `tests` are `file.py::function` names; `alternative` is what a refusal's error
    names instead."""

    class_: str
    why: str
    tests: tuple = ()
    alternative: str = ""


#: a table's name for a launch refusal -> the flag the serving rule names (one rule refuses both)
RULE_ALIASES = {"--grpc-mode": "--smg-grpc-mode", "--offload-group-size": "--offload-mode"}


def launch_rule(name: str):
    """The serving rule that refuses `name` (a `--flag` or an environment setting) at launch: its `Refusal` in
    `vradix.closed_world.unversioned.REFUSALS` (the KV canary's injections share one), or its flag in
    `vradix.closed_world.epd.EPD_FLAGS`. A table entry classified as refused at launch is built through this lookup,
    so no table claims a refusal serving does not make (`LookupError` naming it at import)."""
    from vradix.closed_world import epd, unversioned

    flag = RULE_ALIASES.get(name, name)
    if flag in unversioned.KV_CANARY_PERTURBATIONS:
        flag = unversioned.KV_CANARY_PERTURBATIONS[0]
    word = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
    for rule in unversioned.REFUSALS:
        if word.search(rule.flag):
            return rule
    for _field, epd_flag in epd.EPD_FLAGS:
        if epd_flag == flag:
            return epd_flag
    raise LookupError(f"{name}: a census table classifies it as refused at launch, but no serving rule refuses it")


def table_modules() -> list:
    """Every table module of `TABLE_MODULES`, imported (each must exist)."""
    import importlib
    return [importlib.import_module(f"{__name__}.{name}") for name in TABLE_MODULES]


def doc_of(module) -> str:
    """The page under docs/ that embeds `module`'s blocks (its `DOC`, e.g. `census/flags.md`)."""
    return module.DOC


def unclassified(table: Mapping[str, Entry], live: Iterable[str]) -> list[str]:
    """What SGLang has that the table does not classify."""
    return sorted(set(live) - set(table))


def vanished(table: Mapping[str, Entry], live: Iterable[str]) -> list[str]:
    """What the table classifies that SGLang no longer has."""
    return sorted(set(table) - set(live))


def malformed(table: Mapping[str, Entry]) -> list[str]:
    """Entries with an unknown class, no reason, a missing proof or a refusal without its alternative."""
    bad = []
    for name, e in table.items():
        if e.class_ not in CLASSES:
            bad.append(f"{name}: unknown class {e.class_!r}")
        if not e.why.strip():
            bad.append(f"{name}: no reason given")
        if e.class_ in NEEDS_TEST and not e.tests:
            bad.append(f"{name}: a {e.class_} entry must name its tests")
        if e.class_ == "refused" and not e.alternative.strip():
            bad.append(f"{name}: a refused entry must name the alternative")
        bad += [f"{name}: test name {t!r} is not file.py::function" for t in e.tests
                if not re.fullmatch(r"[\w/]+\.py::\w+", t)]
    return bad


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(title: str, table: Mapping[str, Entry]) -> str:
    """The markdown block a census page embeds for one table (rows sorted by name)."""
    lines = [f"**{title}** ({len(table)} entries)", "",
             "| name | class | why | tests | alternative |", "|---|---|---|---|---|"]
    for name in sorted(table):
        e = table[name]
        tests = ", ".join(f"`{t}`" for t in e.tests) or "—"
        lines.append(f"| `{_cell(name)}` | {e.class_} | {_cell(e.why)} | {tests} | {_cell(e.alternative) or '—'} |")
    return "\n".join(lines)


def marker(block: str) -> tuple[str, str]:
    return f"<!-- census:{block} -->", f"<!-- /census:{block} -->"


def embedded(doc: str, block: str) -> str | None:
    """The text between a block's markers in `doc` (None when the markers are missing)."""
    start, end = marker(block)
    m = re.search(re.escape(start) + r"\n(.*?)" + re.escape(end), doc, re.S)
    return None if m is None else m.group(1).removesuffix("\n")


def embed(doc: str, block: str, text: str) -> str:
    """`doc` with the block's text replaced (markers must exist)."""
    start, end = marker(block)
    if embedded(doc, block) is None:
        raise ValueError(f"the page has no {start} ... {end} block")
    return re.sub(re.escape(start) + r"\n.*?" + re.escape(end), lambda _: f"{start}\n{text}\n{end}", doc,
                  flags=re.S)
