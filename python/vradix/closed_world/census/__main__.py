"""`python -m vradix.closed_world.census --write`: regenerate the census blocks of docs/coverage.md (without
`--write`: exit 1 and name the blocks that are out of date)."""
from __future__ import annotations

import argparse
import pathlib
import sys

from vradix.closed_world import census


def rendered_blocks() -> dict:
    """{block name: markdown} for every table of every census module, and the blocks a module renders its own way
    (`EXTRA_BLOCKS`: {block name: callable returning markdown}, e.g. a matrix)."""
    blocks = {}
    for module in census.table_modules():
        for block, (title, _enumerate, table) in module.TABLES.items():
            blocks[block] = census.render_table(title, table)
        for block, render in getattr(module, "EXTRA_BLOCKS", {}).items():
            blocks[block] = render()
    return blocks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--doc", default=str(pathlib.Path(__file__).resolve().parents[4] / "docs" / "coverage.md"))
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    path = pathlib.Path(args.doc)
    doc = path.read_text()
    stale = []
    for block, text in rendered_blocks().items():
        if census.embedded(doc, block) != text:
            stale.append(block)
            doc = census.embed(doc, block, text)
    if args.write:
        path.write_text(doc)
        print(f"wrote {len(stale)} block(s): {', '.join(stale) or 'none changed'}")
        return 0
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m vradix.closed_world.census --write)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
