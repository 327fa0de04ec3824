"""Garbage collection of a HiCache `file` store: delete the pages of weight identities that are no longer live.

    python -m vradix.l3 gc --dir STORE {--keep WEIGHT_ID | --url SERVER}... [--dry-run] [--json]

Live identities are the `--keep` ones plus, for each `--url`, the weight_id of every scheduler the server reports
(`/get_server_info`: `internal_states[*].vradix.weight_id`; one per data-parallel rank). Every engine that reads or
writes the store must be named or kept: an identity nobody names is dead.

Invariants:
- a page file is deleted only when the manifests (`vradix.l3.manifest`) attribute it and every identity they
  attribute it to is dead; a page nobody attributed (a stock engine's, one whose line a crash tore, anything not a page)
  is reported and kept;
- the manifests are read before the servers are asked for their identities: a page attributed in that snapshot
  belongs to an identity that was already published when the servers answered, so it is dead only if no server
  still serves it;
- a server that does not answer, or answers without a vradix weight_id, stops the collection before anything is
  deleted.
"""
from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Set

from vradix.l3 import manifest

#: a page file: a 64-hex-digit chain hash, then SGLang's pool/model/rank suffix, then `.bin`
PAGE_FILE = re.compile(r"^([0-9a-f]{64})[._].*\.bin$")


class LiveIdentityError(RuntimeError):
    """The live identities could not be established; nothing is deleted."""


@dataclass
class Tally:
    files: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.files += 1
        self.bytes += size


@dataclass
class Report:
    """What a collection found and freed. `dead`: per dead identity, the pages deleted (or, with dry_run, that would
    be); `live`: per live identity, the pages kept; `unattributed`: pages no manifest names (kept)."""

    store: str
    live_ids: List[str]
    dry_run: bool
    dead: Dict[str, Tally] = field(default_factory=dict)
    live: Dict[str, Tally] = field(default_factory=dict)
    unattributed: Tally = field(default_factory=Tally)
    already_gone: int = 0

    @property
    def freed(self) -> Tally:
        return Tally(sum(t.files for t in self.dead.values()), sum(t.bytes for t in self.dead.values()))

    def as_dict(self) -> dict:
        return {"store": self.store, "dry_run": self.dry_run, "live_ids": self.live_ids,
                "freed": vars(self.freed), "dead": _plain(self.dead), "live": _plain(self.live),
                "unattributed": vars(self.unattributed), "already_gone": self.already_gone}

    def text(self) -> str:
        verb = "would free" if self.dry_run else "freed"
        lines = [f"vradix L3 gc of {self.store}: {verb} {self.freed.files} page file(s), {self.freed.bytes} bytes"]
        lines += [f"  dead  {wid}: {t.files} file(s), {t.bytes} bytes" for wid, t in sorted(self.dead.items())]
        lines += [f"  live  {wid}: {t.files} file(s), {t.bytes} bytes kept" for wid, t in sorted(self.live.items())]
        lines.append(f"  unattributed (kept): {self.unattributed.files} file(s), {self.unattributed.bytes} bytes")
        if self.already_gone:
            lines.append(f"  {self.already_gone} file(s) were already gone (evicted meanwhile)")
        return "\n".join(lines)


def _plain(tallies: Dict[str, Tally]) -> dict:
    return {wid: vars(t) for wid, t in sorted(tallies.items())}


def server_weight_ids(url: str, timeout: float = 10.0) -> List[str]:
    """The weight_id of every scheduler of the vradix server at `url`. Raises LiveIdentityError."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/get_server_info", timeout=timeout) as resp:
            info = json.load(resp)
    except (OSError, ValueError) as e:
        raise LiveIdentityError(f"{url}: cannot read /get_server_info ({e}); refusing to collect") from e
    ids = [(s or {}).get("vradix", {}).get("weight_id") for s in info.get("internal_states") or [None]]
    if not ids or not all(ids):
        raise LiveIdentityError(f"{url}: no vradix weight_id in /get_server_info (vradix off, or a stock server); "
                                "refusing to collect")
    return ids


def live_identities(keep: Iterable[str], urls: Iterable[str]) -> Set[str]:
    live = set(keep)
    for url in urls:
        live.update(server_weight_ids(url))
    if not live:
        raise LiveIdentityError("no live identity given (--keep or --url); refusing to collect everything")
    return live


def page_files(store_dir: str):
    """(name, hash, size) of every page file in the store (SGLang writes them flat in its directory)."""
    with os.scandir(store_dir) as entries:
        for entry in entries:
            m = PAGE_FILE.match(entry.name)
            if m is None or not entry.is_file(follow_symlinks=False):
                continue
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue  # evicted by a server while we scanned
            yield entry.name, m.group(1), size


def collect(store_dir: str, *, keep: Iterable[str] = (), urls: Iterable[str] = (), dry_run: bool = False) -> Report:
    """Delete (unless `dry_run`) the page files of dead identities in `store_dir`; see the module docstring."""
    owners = manifest.read(store_dir)  # before asking for the live identities (see the invariants)
    live = live_identities(keep, urls)
    report = Report(store=store_dir, live_ids=sorted(live), dry_run=dry_run)
    for name, page, size in page_files(store_dir):
        ids = owners.get(page)
        if not ids:
            report.unattributed.add(size)
            continue
        alive = ids & live
        if alive:
            report.live.setdefault(min(alive), Tally()).add(size)
            continue
        if not dry_run and not _remove(os.path.join(store_dir, name)):
            report.already_gone += 1
            continue
        report.dead.setdefault(min(ids), Tally()).add(size)
    return report


def _remove(path: str) -> bool:
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return False
