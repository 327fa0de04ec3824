"""The flag combination matrix (`vradix_census.matrix`): every `versioned` or `refused` field of the
flag census, with each column flag, is decided, and the decision holds where it can be checked without a server.

- no cell is undecided: each is `supported` with tests, `refused at startup` with the test that shows it, or `n/a`
  with a reason; every test a cell names exists;
- a cell refused at launch because of its combination is refused by vradix's launch checks (`unversioned.check`,
  `staleness.check_server`) on the combined arguments, and a `supported` cell's arguments pass them;
- `test_an_undecided_cell_fails_the_matrix` shows the check failing on a row without a decision."""
import pathlib

import pytest

from vradix.closed_world import unversioned
from vradix_census import flags, matrix
from vradix.core import staleness
from vradix.testing.harness.suite import find_test_file, functions_in

ROOT = pathlib.Path(__file__).resolve().parents[2]
CELLS = [(name, col) for name in matrix.rows() for col in matrix.COLUMNS]


def undecided(names) -> list:
    """Every (field, column) without a well-formed decision, with why."""
    bad = []
    for name in names:
        for col in matrix.COLUMNS:
            try:
                c = matrix.cell(name, col)
            except KeyError:
                bad.append(f"{name} × {col}: no decision")
                continue
            if c.decision not in matrix.DECISIONS:
                bad.append(f"{name} × {col}: unknown decision {c.decision!r}")
            elif c.decision != "n/a" and not c.tests:
                bad.append(f"{name} × {col}: a {c.decision} cell must name its tests")
            if not c.text.strip():
                bad.append(f"{name} × {col}: no reason")
    return bad


def refusal(args, window: int):
    """The error vradix's launch checks raise for these arguments, or None."""
    try:
        unversioned.check(args)
        staleness.check_server(args, window)
    except (unversioned.UnversionedPathError, staleness.StalenessError) as e:
        return e
    return None


def test_every_versioned_or_refused_field_is_a_row_and_every_cell_is_decided():
    rows = matrix.rows()
    assert rows == sorted(n for n, e in flags.FLAGS.items() if e.class_ in ("versioned", "refused"))
    assert not undecided(rows), "\n".join(undecided(rows))


def test_every_test_a_cell_names_exists():
    missing = []
    for name, col in CELLS:
        for node in matrix.cell(name, col).tests:
            file, fn = node.split("::")
            path = find_test_file(file)
            if path is None or fn not in functions_in(path):
                missing.append(f"{name} × {col}: {node}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("name,col", [(n, c) for n, c in CELLS if matrix.cell(n, c).by == "launch"],
                         ids=lambda v: v)
def test_a_combination_refused_at_launch_is_refused_by_the_launch_checks(name, col):
    args, window = matrix.arguments(name, col)
    assert refusal(args, window) is not None, f"{name} × {col}: nothing refuses {vars(args)} (window {window})"


@pytest.mark.parametrize("name,col", [(n, c) for n, c in CELLS if matrix.cell(n, c).decision == "supported"],
                         ids=lambda v: v)
def test_a_supported_combination_passes_the_launch_checks(name, col):
    args, window = matrix.arguments(name, col)
    assert refusal(args, window) is None, f"{name} × {col}: {refusal(args, window)}"


def test_an_undecided_cell_fails_the_matrix(monkeypatch):
    """A versioned field the matrix has no decisions for is named, once per column."""
    monkeypatch.setitem(flags.FLAGS, "planted_by_the_test", flags.FLAGS["tp_size"])
    monkeypatch.setattr(flags, "RANK_FIELDS", frozenset())
    monkeypatch.setitem(matrix.KV_ROWS, "planted_by_the_test", {"window": matrix.KV_ROWS["page_size"]["window"]})
    bad = undecided(["planted_by_the_test"])
    assert bad == [f"planted_by_the_test × {col}: no decision" for col in matrix.COLUMNS if col != "window"]


def test_no_field_is_classified_twice():
    seen, twice = set(), []
    for group in flags.GROUPS:
        twice += sorted(seen & set(group))
        seen |= set(group)
    assert not twice, f"classified in two groups: {twice}"


def test_the_cells_named_as_fuzzed_are_drawn_by_the_fuzzers_long_profile():
    """Every cell the matrix calls run together by the fuzzer is drawn by its long profile's default seed and count (`fuzzer.LONG_PROFILE_*`)
    (a combination setting the row's path and the column's), and is a supported cell."""
    import random
    from vradix.testing.harness import fuzzer
    rng = random.Random(fuzzer.LONG_PROFILE_SEED)
    combos = [fuzzer.draw_combination(rng) for _ in range(fuzzer.LONG_PROFILE_COMBINATIONS)]
    row_on = {"page_size": lambda c: c.page_size > 1, "chunked_prefill_size": lambda c: c.chunked_prefill_size < 1024,
              "disable_overlap_schedule": lambda c: not c.overlap}
    column_on = {"radix-off": lambda c: not c.radix, "window": lambda c: c.window > 0,
                 "streaming": lambda c: c.sessions, "hicache": lambda c: c.hicache}
    for name, column in sorted(matrix.FUZZED):
        assert any(row_on[name](c) and column_on[column](c) for c in combos), (name, column)
        c = matrix.cell(name, column)
        assert c.decision == "supported" and c.pair and matrix.FUZZER_LONG_PROFILE in c.tests, (name, column)
