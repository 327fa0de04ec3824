"""`python -m vradix.inspector --url URL`: print what a vradix engine's radix cache holds, per epoch and label;
`--response FILE`: the per-token weight versions of a saved response.

- `--url`: reads `GET /vradix/cache` (read-only, bounded: see docs/inspector.md). Exit status: 0 on success; 2 when
  vradix is not active on the server (the endpoint is absent: stock SGLang or `VRADIX_DISABLE=1`; or the engine has
  no radix cache); 1 on any other error (unreachable server, bad query). `--json` prints the server's JSON as is.
- `--response`: a finished response saved as JSON (native `/generate`, a batched `/generate` list, an OpenAI
  completion or chat completion; one per line also works; `-` reads standard input), read by `vradix.trainer`: per
  output token, the weights that sampled it, the oldest and newest weights of the KV it read, its staleness and
  fresh/crossing/stale, printed as runs of tokens that share them. SGLang keeps no finished request to look up by
  id, so a response is read from where the client saved it. Exit status 1 on a file that is no response.
  `--json` prints the per-token columns.

Standard library only (and `vradix.trainer`, itself client side), so it runs anywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

PATH = "/vradix/cache"
NOT_ACTIVE = 2


class InspectError(RuntimeError):
    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def fetch(url: str, *, limit: int = 10, offset: int = 0, head: int = 0, api_key: Optional[str] = None,
          timeout: float = 30.0) -> dict:
    """The server's snapshot; raises InspectError (status NOT_ACTIVE when vradix is not active there)."""
    base = url.rstrip("/")
    query = urllib.parse.urlencode({"limit": limit, "offset": offset, "head": head})
    req = urllib.request.Request(f"{base}{PATH}?{query}")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        if e.code == 404:
            raise InspectError(f"vradix is not active on {base}: {PATH} is not served (stock SGLang, or vradix "
                               "disabled with VRADIX_DISABLE=1)", NOT_ACTIVE) from None
        if e.code == 409:
            reason = _json_field(body, "reason") or body
            raise InspectError(f"vradix is not active on {base}: {reason}", NOT_ACTIVE) from None
        raise InspectError(f"{base}{PATH}: HTTP {e.code}: {_json_field(body, 'error') or body}") from None
    except (urllib.error.URLError, OSError) as e:
        raise InspectError(f"cannot reach {base}: {e}") from None


def _json_field(body: str, key: str) -> Optional[str]:
    try:
        return json.loads(body).get(key)
    except (ValueError, AttributeError):
        return None


def render(view: dict, now: Optional[float] = None) -> str:
    """A compact text view of one snapshot (or of each DP rank's)."""
    if "ranks" in view:
        return "\n".join(f"-- DP rank {i}\n{render(v, now)}" for i, v in enumerate(view["ranks"]))
    now = time.time() if now is None else now
    lines = [f"vradix cache: epoch {view['epoch']} label={view['label']!r} ({view['tree_core']}, page "
             f"{view['page_size']}): {view['cached_tokens']} cached tokens ({view['protected_tokens']} locked), "
             f"snapshot {view['snapshot_ms']} ms"]
    lines.append(f"  {'epoch':>5} {'label':<16} {'tokens':>8} {'nodes':>6} {'pinned':>7}  pinned by")
    for row in view["epochs"]:
        nodes = "-" if row["nodes"] is None else row["nodes"]
        who = ", ".join(map(str, row["pinned_by"])) + (" ..." if row["crossing_requests"] > len(row["pinned_by"])
                                                        else "")
        mark = "*" if row["current"] else " "
        lines.append(f" {mark}{row['epoch']:>5} {str(row['label']):<16} {row['cached_tokens']:>8} {nodes:>6} "
                     f"{row['pinned_tokens']:>7}  {who}")
    w = view.get("window")
    if w:
        split = w["tokens_by_namespace"] or "not split on this tree core (the current row includes them)"
        lines.append(f"  staleness window {w['window']}: epochs {w['epochs']} kept; tokens by namespace {split}; "
                     f"{w['bounded_requests']} bounded request(s) reused {w['stale_tokens_reused_by_staleness']} "
                     "stale tokens by staleness")
    stale = view["stale"]
    lines.append(f"  stale: {stale['pinned_tokens']} tokens pinned by {stale['crossing_requests']} crossing "
                 f"request(s), {stale['awaiting_reclaim_tokens']} awaiting reclaim")
    if view.get("host"):
        h = view["host"]
        lines.append(f"  host tier: {h['used']}/{h['total']} tokens used, by epoch {h.get('tokens_by_epoch')}, "
                     f"{h['transfers_in_flight']} transfer(s) in flight")
    if view.get("storage"):
        s = view["storage"]
        lines.append(f"  storage tier ({s['backend']}): pages backed up by weight_id "
                     f"{s['pages_backed_up_by_weight_id']}")
    top = view["top_prefixes"]
    lines.append(f"  top prefixes by hits (offset {top['offset']}, {len(top['items'])} shown, {top['tracked']} "
                 f"tracked{'' if top['next_offset'] is None else ', more from offset ' + str(top['next_offset'])}):")
    for p in top["items"]:
        head = f" head={p['head_tokens']}" if "head_tokens" in p else ""
        lines.append(f"    node {p['node']:>6} epoch {p['epoch']} label={p['label']!r}{' STALE' if p['stale'] else ''}"
                     f" tokens={p['tokens']} hits={p['hits']} locks={p['lock_count']} "
                     f"last={max(0.0, now - p['last_access']):.1f}s ago{head}")
    return "\n".join(lines)


def read_responses(path: str) -> list:
    """The responses saved at `path` (`-`: standard input): one JSON document (a response, or a list of them, as a
    batched `/generate` answers) or one response per line. Raises InspectError on anything else."""
    try:
        text = sys.stdin.read() if path == "-" else pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InspectError(f"cannot read {path}: {e}") from None
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except ValueError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise InspectError(f"{path} is neither JSON nor one JSON response per line: {e}") from None


def token_runs(tv) -> list:
    """Runs of consecutive output tokens that share sampler, KV versions, staleness and kind:
    [(first, last, sampler, kv_oldest, kv_newest, staleness, kind)]."""
    runs: list = []
    for k, row in enumerate(zip(tv.sampler, tv.kv_oldest, tv.kv_newest, tv.staleness, tv.kind)):
        if runs and runs[-1][2:] == row:
            runs[-1] = (runs[-1][0], k, *row)
        else:
            runs.append((k, k, *row))
    return runs


def render_tokens(tv, index: Optional[int] = None) -> str:
    """A compact text view of one response's per-token versions (`vradix.trainer.TokenVersions`)."""
    counts = tv.counts()
    head = "" if index is None else f"-- response {index}\n"
    lines = [f"{head}{len(tv)} output tokens after a {tv.prompt_tokens}-token prompt: "
             + ", ".join(f"{counts[k]} {k}" for k in counts)
             + ("" if tv.described else " (no vradix provenance in this response: reused stale KV would go unseen)")]
    lines.append(f"  {'tokens':>11}  {'sampled by':<12} {'KV read':<20} {'staleness':>9}  kind")
    for first, last, sampler, old, new, staleness, kind in token_runs(tv):
        kv = str(old) if old == new else f"{old} .. {new}"
        lines.append(f"  {f'{first}-{last}':>11}  {str(sampler):<12} {kv:<20} {staleness:>9}  {kind}")
    return "\n".join(lines)


def inspect_responses(path: str, as_json: bool) -> str:
    """The `--response` view of every response saved at `path`. Raises InspectError on a file that is no response."""
    from vradix.trainer import ResponseError, TokenVersions
    responses = read_responses(path)
    read = []
    for i, response in enumerate(responses):
        try:
            read.append(TokenVersions.from_response(response))
        except (ResponseError, KeyError, TypeError, AttributeError) as e:
            raise InspectError(f"{path}: response {i} has no per-token versions: {e}") from None
    if as_json:
        columns = [{**tv.columns(), "prompt_tokens": tv.prompt_tokens, "described": tv.described} for tv in read]
        return json.dumps(columns if len(columns) > 1 else columns[0], indent=2)
    return "\n".join(render_tokens(tv, i if len(read) > 1 else None) for i, tv in enumerate(read))


def parser(prog: str = "python -m vradix.inspector") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--url", help="the SGLang server, e.g. http://127.0.0.1:30000: its radix cache, per epoch")
    what.add_argument("--response", metavar="FILE",
                      help="a saved response (JSON, a list of them, or one per line; - for standard input): its "
                           "per-token weight versions")
    p.add_argument("--limit", type=int, default=10, help="top prefixes to show (at most 200)")
    p.add_argument("--offset", type=int, default=0, help="skip this many top prefixes (pagination)")
    p.add_argument("--head", type=int, default=8, help="first token ids of each prefix to show (at most 16)")
    p.add_argument("--api-key", default=os.environ.get("VRADIX_API_KEY") or None,
                   help="API key, when the server requires one (default: $VRADIX_API_KEY)")
    p.add_argument("--json", action="store_true", help="print the server's JSON (with --response: the per-token columns)")
    return p


def main(argv=None, prog: str = "python -m vradix.inspector") -> int:
    args = parser(prog).parse_args(argv)
    if args.response is not None:
        try:
            print(inspect_responses(args.response, args.json))
        except InspectError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.status
        return 0
    try:
        view = fetch(args.url, limit=args.limit, offset=args.offset, head=args.head, api_key=args.api_key)
    except InspectError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    print(json.dumps(view, indent=2) if args.json else render(view))
    return 0


if __name__ == "__main__":
    sys.exit(main())
