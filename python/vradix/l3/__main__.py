"""`python -m vradix.l3 gc`: delete the HiCache `file`-store pages of weight identities that are no longer live."""
from __future__ import annotations

import argparse
import json
import os
import sys

from vradix.l3 import gc


def parser(prog: str = "python -m vradix.l3") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gc", help="delete the pages of dead weight identities", description=gc.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--dir", default=None,
                   help="the store directory (default: $SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR, else /tmp/hicache)")
    g.add_argument("--keep", action="append", default=[], metavar="WEIGHT_ID", help="a live identity (repeatable)")
    g.add_argument("--url", action="append", default=[], metavar="SERVER",
                   help="a vradix server whose current identities are live (repeatable)")
    g.add_argument("--dry-run", action="store_true", help="report what would be deleted; delete nothing")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv=None, prog: str = "python -m vradix.l3") -> int:
    args = parser(prog).parse_args(argv)
    store = args.dir or os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR") or "/tmp/hicache"
    if not os.path.isdir(store):
        print(f"vradix L3 gc: {store} is not a directory", file=sys.stderr)
        return 2
    try:
        report = gc.collect(store, keep=args.keep, urls=args.url, dry_run=args.dry_run)
    except gc.LiveIdentityError as e:
        print(f"vradix L3 gc: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
