"""Report hooks: per-response provenance and the HTTP /flush_cache report (the Prometheus gauges are
`vradix.observability.metrics`).

Per-response provenance has to cross from the scheduler process to the tokenizer manager (HTTP) process. It travels
in the one per-request field `BatchTokenIDOutput` already carries for plugins, `customized_info`, under the key
`provenance.PROVENANCE_KEY`, and only for finished requests (so streaming responses get it on the final chunk):
- scheduler: `attach_provenance` (AROUND `_GenerationStreamAccumulator.accept`) appends a finished request's
  provenance to the accumulator's `customized_info`, padded with None for the other requests of the batch;
- tokenizer manager: `provenance_to_meta_info` (AROUND `TokenizerManager.update_request_meta_info`) moves it into
  `meta_info` as `prefix_cache` / `kv_weight_versions` and hands the remaining keys, if any, to SGLang;
- OpenAI endpoints: `provenance_to_openai_metadata` (AFTER `build_endpoint_weight_version_metadata`) copies it into
  the response's `metadata`, next to `weight_version`.
"""
from __future__ import annotations

from typing import Optional

from vradix.core import provenance

META_KEYS = ("prefix_cache", "kv_weight_versions", "kv_ledger_spans", "pd_spans", "vradix_staleness",
             # upstream SGLang's and miles' names for the same facts (`provenance.upstream_fields`)
             "prefill_weight_versions", "first_prefill_weight_version", "min_forward_weight_version",
             "max_forward_weight_version", "last_forward_weight_version")


# ---- per-response provenance ------------------------------------------------------------------------------------
def attach_provenance(original, acc, *args, **kwargs):
    """AROUND _GenerationStreamAccumulator.accept: add a finished request's provenance to the batch output."""
    req = kwargs.get("req", args[0] if args else None)
    emitted = len(acc.rids)
    result = original(acc, *args, **kwargs)
    if len(acc.rids) > emitted and req is not None and req.finished():
        info = provenance.response_provenance(req)
        if info is not None:
            # SGLang pads every existing column for each emitted request; ours holds one entry per request
            column = acc.customized_info.setdefault(provenance.PROVENANCE_KEY, [])
            column.extend([None] * (len(acc.rids) - len(column)))
            column[len(acc.rids) - 1] = info
    return result


def provenance_to_meta_info(original, tm, meta_info, state, customized_info, index, *args, **kwargs):
    """AROUND TokenizerManager.update_request_meta_info: our key becomes meta_info fields, never a token list."""
    if provenance.PROVENANCE_KEY not in customized_info:
        return original(tm, meta_info, state, customized_info, index, *args, **kwargs)
    column = customized_info[provenance.PROVENANCE_KEY]
    info = column[index] if index < len(column) else None
    if isinstance(info, dict):
        meta_info.update({k: info[k] for k in META_KEYS if k in info})
    rest = {k: v for k, v in customized_info.items() if k != provenance.PROVENANCE_KEY}
    if rest:
        return original(tm, meta_info, state, rest, index, *args, **kwargs)
    return None


def provenance_to_openai_metadata(result, meta_info, *args, **kwargs):
    """AFTER build_endpoint_weight_version_metadata: OpenAI responses carry the same provenance in `metadata`."""
    for key in META_KEYS:
        if key in meta_info:
            result[key] = meta_info[key]
    return result


# ---- /flush_cache over HTTP ----------------------------------------------------------------------------------------
_last_flush_message: Optional[str] = None


async def remember_flush_message(original, tm, *args, **kwargs):
    """AROUND TokenizerControlMixin.flush_cache (launcher process): keep the scheduler's flush report, which the
    HTTP handler replaces with a fixed text on success."""
    global _last_flush_message
    result = await original(tm, *args, **kwargs)
    message = getattr(result, "message", None)
    _last_flush_message = message if message and message.startswith("vradix:") else None
    return result


def add_flush_report_middleware(*args, **kwargs):
    """BEFORE http_server.launch_server: append the vradix flush report to the body of a successful /flush_cache."""
    from sglang.srt.entrypoints.http_server import app

    app.add_middleware(FlushReportMiddleware)


class FlushReportMiddleware:
    """Pure ASGI middleware (SGLang's own http middleware sends responses itself, so a BaseHTTPMiddleware-style body
    rewrite cannot work): buffers the /flush_cache response and appends the scheduler's report line."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        global _last_flush_message
        if scope["type"] != "http" or scope["path"] != "/flush_cache" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        _last_flush_message = None
        start, body = None, []

        async def buffer(message):
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body":
                return await send(message)
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            content = b"".join(body)
            if start["status"] == 200 and _last_flush_message:
                content += (_last_flush_message + "\n").encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(content)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": content})

        await self.app(scope, receive, buffer)
