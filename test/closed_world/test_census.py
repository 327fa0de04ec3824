"""The census tables (`vradix_census`) hold SGLang's live objects to a classification.

For every table of every census module: nothing SGLang has is unclassified, nothing classified has vanished from
SGLang, every entry is well formed and the tests it names exist (and at least one runs in `make test`), and the
generated block of docs/census/ is up to date. `test_a_planted_entry_fails_the_census` shows the check failing
on an entry SGLang has and no table classifies."""
import pathlib

import pytest

import vradix_census as census
from vradix_census.__main__ import block_docs, rendered_blocks
from vradix.testing.harness.suite import find_test_file, functions_in, is_long_test

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tables():
    """(block, enumerate, table) of every census module's tables."""
    return [(block, enumerate_, table) for module in census.table_modules()
            for block, (_title, enumerate_, table) in module.TABLES.items()]


TABLES = tables()


@pytest.mark.parametrize("block,enumerate_,table", TABLES, ids=[t[0] for t in TABLES])
def test_every_live_entry_is_classified_and_every_classified_entry_is_live(block, enumerate_, table):
    live = enumerate_()
    assert live, f"{block}: the census enumerated nothing"
    assert not census.unclassified(table, live), f"{block}: unclassified: {census.unclassified(table, live)}"
    assert not census.vanished(table, live), f"{block}: no longer in SGLang: {census.vanished(table, live)}"


@pytest.mark.parametrize("block,enumerate_,table", TABLES, ids=[t[0] for t in TABLES])
def test_every_entry_is_well_formed_and_its_tests_exist(block, enumerate_, table):
    problems = census.malformed(table)
    for name, entry in table.items():
        for node in entry.tests:
            file, fn = node.split("::")
            path = find_test_file(file)
            if path is None or fn not in functions_in(path):
                problems.append(f"{name}: names {node}, which does not exist")
        if entry.tests and all(is_long_test(t) for t in entry.tests):
            problems.append(f"{name}: every test it names runs only in `make test-long`")
    assert not problems, "\n".join(problems)


def test_the_census_pages_embed_every_table_as_generated():
    """The page under docs/census/ each table module names (`DOC`) embeds each of its blocks as generated."""
    where = block_docs()
    assert all(page.startswith("census/") for page in where.values()), where
    stale = [f"{block} in docs/{where[block]}" for block, text in rendered_blocks().items()
             if census.embedded((ROOT / "docs" / where[block]).read_text(), block) != text]
    assert not stale, f"out of date: {stale} (python -m vradix_census --write)"


def test_a_planted_entry_fails_the_census():
    """An entry SGLang has that no table classifies is named; so is a classified entry SGLang does not have."""
    block, enumerate_, table = TABLES[0]
    live = set(enumerate_())
    planted = "PlantedByTheTest"
    assert census.unclassified(table, live | {planted}) == [planted]
    table_with_ghost = {**table, planted: census.Entry("irrelevant", "a ghost")}
    assert census.vanished(table_with_ghost, live) == [planted]
