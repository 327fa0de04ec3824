"""Report hooks (data-path step 5, launcher process): per-response provenance and the HTTP /flush_cache report (the
Prometheus series are `vradix.observability.metrics`).

Per-response provenance has to cross from the scheduler process to the tokenizer manager (HTTP) process. It travels
in the one per-request field `BatchTokenIDOutput` already carries for plugins, `customized_info`, under the key
`provenance.PROVENANCE_KEY`, and only for finished requests (so streaming responses get it on the final chunk):
- scheduler: `hooks.server_info.attach_provenance` (AROUND `_GenerationStreamAccumulator.accept`) appends a finished request's
  provenance to the accumulator's `customized_info`, padded with None for the other requests of the batch;
- tokenizer manager: `provenance_to_meta_info` (AROUND `TokenizerManager.update_request_meta_info`) moves it into
  `meta_info` as `prefix_cache` / `kv_weight_versions` / the upstream and miles fields, adds miles' response segments
  (from SGLang's own `weight_versions`, already in `meta_info`), leaves any field SGLang produced itself as SGLang
  made it, and hands the remaining keys, if any, to SGLang;
- OpenAI endpoints: `provenance_to_openai_metadata` (AFTER `build_endpoint_weight_version_metadata`) copies it into
  the response's `metadata`, next to `weight_version`.
"""
from __future__ import annotations

import functools
import json
from typing import Optional

from starlette.requests import Request

from vradix.core import provenance
from vradix.hooks.inspector import PATH, QUERY_PREFIX
from vradix.observability import snapshot

META_KEYS = ("prefix_cache", "kv_weight_versions", "kv_ledger_spans", "pd_spans", "vradix_staleness",
             # upstream SGLang's and miles' names for the same facts (`provenance.upstream_fields`)
             "prefill_weight_versions", "first_prefill_weight_version", "min_forward_weight_version",
             "max_forward_weight_version", "last_forward_weight_version")
#: miles' names for SGLang's own per-output-token `weight_versions`, added in this process
#: (`provenance.response_weight_version_segments`)
RESPONSE_KEYS = ("response_weight_version", "response_weight_version_segments")


# ---- per-response provenance ------------------------------------------------------------------------------------
def sglang_emits(server_args_cls) -> frozenset:
    """The upstream fields an SGLang whose `ServerArgs` is `server_args_cls` produces itself: `prefill_weight_versions`
    when it has upstream's `enable_prefill_weight_versions` field (SGLang after 0.5.23). vradix leaves those to it,
    so a response never carries a second copy computed differently."""
    fields = getattr(server_args_cls, "__struct_fields__", None)
    if fields is None:
        fields = getattr(server_args_cls, "__dataclass_fields__", {})
    return frozenset({"prefill_weight_versions"}) if "enable_prefill_weight_versions" in fields else frozenset()


@functools.cache
def native_fields() -> frozenset:
    """`sglang_emits` of the running SGLang (read once per process; SGLang 0.5.23: none)."""
    from sglang.srt.server_args import ServerArgs

    return sglang_emits(ServerArgs)


def add_to_meta_info(meta_info: dict, info: dict, native: frozenset) -> None:
    """A finished request's provenance `info` into its `meta_info`, with miles' response fields derived from SGLang's
    own `weight_versions` (already in `meta_info`). A field the host SGLang produces itself (`native`), or already put
    in `meta_info`, is left as SGLang made it: one copy, SGLang's."""
    for key in META_KEYS:
        if key in info and key not in native and key not in meta_info:
            meta_info[key] = info[key]
    response = provenance.response_weight_version_segments(meta_info.get("weight_versions"),
                                                           int(meta_info.get("completion_tokens") or 0))
    for key, value in response.items():
        if key not in native and key not in meta_info:
            meta_info[key] = value


def provenance_to_meta_info(original, tm, meta_info, state, customized_info, index, *args, **kwargs):
    """AROUND TokenizerManager.update_request_meta_info: our key becomes meta_info fields, never a token list."""
    if provenance.PROVENANCE_KEY not in customized_info:
        return original(tm, meta_info, state, customized_info, index, *args, **kwargs)
    column = customized_info[provenance.PROVENANCE_KEY]
    info = column[index] if index < len(column) else None
    if isinstance(info, dict):
        add_to_meta_info(meta_info, info, native_fields())
    rest = {k: v for k, v in customized_info.items() if k != provenance.PROVENANCE_KEY}
    if rest:
        return original(tm, meta_info, state, rest, index, *args, **kwargs)
    return None


def provenance_to_openai_metadata(result, meta_info, *args, **kwargs):
    """AFTER build_endpoint_weight_version_metadata: OpenAI responses carry the same provenance where the host SGLang
    puts its own `weight_versions` (0.5.23: `metadata`, the block this builder returns)."""
    for key in META_KEYS + RESPONSE_KEYS:
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


# ---- the cache inspector's endpoint (`hooks.inspector` answers in the scheduler) --------------------------------
def add_cache_inspector_endpoint(*args, **kwargs):
    """BEFORE http_server.launch_server: register `GET /vradix/cache` on SGLang's app."""
    from sglang.srt.entrypoints.http_server import app
    from sglang.srt.utils.auth import AuthLevel, auth_level

    if not any(getattr(r, "path", None) == PATH for r in app.router.routes):
        app.add_api_route(PATH, auth_level(AuthLevel.ADMIN_OPTIONAL)(cache_inspector), methods=["GET"])


async def cache_inspector(request: Request):
    """`GET /vradix/cache?limit=&offset=&head=&census_budget=`: one snapshot per DP rank (read-only, bounded)."""
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints.http_server import get_global_state
    from sglang.srt.managers.io_struct import GetInternalStateReq

    params = dict(request.query_params)
    try:
        snapshot.Query.parse(params)
    except snapshot.QueryError as e:
        return ORJSONResponse({"error": str(e)}, status_code=400)
    tm = get_global_state().tokenizer_manager
    tm.auto_create_handle_loop()
    replies = await tm.get_internal_state_communicator(GetInternalStateReq(rid=QUERY_PREFIX + json.dumps(params)))
    views = [r.internal_state.get("vradix_cache") for r in replies]
    body = views[0] if len(views) == 1 else {"active": all(v and v.get("active") for v in views), "ranks": views}
    if any(v and v.get("error") for v in views):
        return ORJSONResponse(body, status_code=400)
    return ORJSONResponse(body, status_code=200 if body.get("active") else 409)
