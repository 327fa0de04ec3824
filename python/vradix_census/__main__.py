"""`python -m vradix_census --write`: regenerate the census blocks of the pages under docs/census/ each table module
names (`DOC`); without `--write`: exit 1 and name the blocks that are out of date."""
from __future__ import annotations

import argparse
import pathlib
import sys

import vradix_census as census


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


def block_docs() -> dict:
    """{block name: the page under docs/ that embeds it} (`census.doc_of`)."""
    return {block: census.doc_of(module) for module in census.table_modules()
            for block in (*module.TABLES, *getattr(module, "EXTRA_BLOCKS", {}))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", default=str(pathlib.Path(__file__).resolve().parents[2] / "docs"))
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    pages: dict[pathlib.Path, str] = {}
    stale: list[str] = []
    where = block_docs()
    for block, text in rendered_blocks().items():
        path = pathlib.Path(args.docs) / where[block]
        doc = pages.setdefault(path, path.read_text())
        if census.embedded(doc, block) != text:
            stale.append(block)
            pages[path] = census.embed(doc, block, text)
    if args.write:
        for path, doc in pages.items():
            path.write_text(doc)
        print(f"wrote {len(stale)} block(s): {', '.join(stale) or 'none changed'}")
        return 0
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m vradix_census --write)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
