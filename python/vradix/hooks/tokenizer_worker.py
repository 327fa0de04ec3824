"""Multi-tokenizer HTTP workers (launcher process, and each worker): every tokenizer worker loads vradix before it
serves, or does not serve.

With `--tokenizer-worker-num N > 1` SGLang's launcher keeps only a router; uvicorn (or Granian) starts N worker
processes that import the app named by `SGLANG_HTTP_SERVER_APP_PATH` (SGLang's `http_server:app` by default) and
never call `load_plugins()`. Each builds its own `TokenizerWorker` (a TokenizerManager), which answers every HTTP
request and control call: without vradix there, the launcher hooks (provenance into `meta_info` and the OpenAI
`metadata`, the bucketed update's generation hold, the friendlier refusals) never run, and `/vradix/cache` and
the `/flush_cache` report are missing.

Two SGLang extension points carry the load into every such process:
- `SGLANG_HTTP_SERVER_APP_PATH` (`name_vradix_worker_app`, before SGLang starts the workers): the workers import
  `vradix.plugin:tokenizer_worker_app`, which loads the plugins, refuses (`VradixInstallError` out of the import:
  the worker exits before it serves) unless vradix installed, and serves the app the setting named before, with the
  HTTP additions the launcher makes to SGLang's app (`serving_app`);
- the launch data SGLang hands every tokenizer worker (`write_data_for_multi_tokenizer`, read back by each HTTP
  worker and by `Engine.attach_tokenizer_worker` in another process) carries a `WorkerLoad` entry whose unpickling
  runs `vradix.plugin.load_in_tokenizer_worker` before that process builds its `TokenizerWorker`.
"""
from __future__ import annotations

import importlib
import os

from vradix import settings
from vradix.settings import CHAINED_APP_PATH_ENV, TOKENIZER_WORKER_APP, TOKENIZER_WORKER_LOAD

#: SGLang's setting naming the app its multi-tokenizer HTTP workers import
APP_PATH_ENV = "SGLANG_HTTP_SERVER_APP_PATH"
#: the key of the launch data's entry that loads vradix where it is read
LAUNCH_DATA_KEY = "vradix_tokenizer_worker"


def name_vradix_worker_app(server_args, *args, **kwargs):
    """BEFORE http_server._setup_and_run_http_server (launcher; the Ray launcher's HTTP server too): with more than one
    tokenizer worker, the workers import vradix's app, which serves the one the setting named before."""
    if getattr(server_args, "tokenizer_worker_num", 1) <= 1:
        return
    from sglang.srt.environ import envs

    current = envs.SGLANG_HTTP_SERVER_APP_PATH.get()
    if current != TOKENIZER_WORKER_APP:
        os.environ[CHAINED_APP_PATH_ENV] = current
    os.environ[APP_PATH_ENV] = TOKENIZER_WORKER_APP


def serving_app():
    """In a tokenizer worker where vradix installed: the app `SGLANG_HTTP_SERVER_APP_PATH` named before vradix's
    (SGLang's by default), after the HTTP additions the launcher makes before it serves (`/vradix/cache`, the
    `/flush_cache` report) were made to SGLang's app here too."""
    from sglang.srt.environ import envs

    from vradix.hooks import report

    report.add_flush_report_middleware()
    report.add_cache_inspector_endpoint()
    path = settings.value(CHAINED_APP_PATH_ENV) or envs.SGLANG_HTTP_SERVER_APP_PATH.default
    module, _, attrs = path.partition(":")
    app = importlib.import_module(module)
    for attr in attrs.split("."):
        app = getattr(app, attr)
    return app


class WorkerLoad:
    """An entry of the tokenizer workers' launch data: unpickled, it resolves `settings.TOKENIZER_WORKER_LOAD`, which
    runs `vradix.plugin.load_in_tokenizer_worker` and is its short text, after vradix installed in the reading process
    (or that process stopped with `VradixInstallError`)."""

    def __reduce__(self):
        import pkgutil

        return pkgutil.resolve_name, (TOKENIZER_WORKER_LOAD,)


def load_vradix_where_launch_data_is_read(original, port_args, server_args, scheduler_info, *args, **kwargs):
    """AROUND multi_tokenizer_mixin.write_data_for_multi_tokenizer (launcher, or the Engine's process): the launch
    data every tokenizer worker reads carries a `WorkerLoad`."""
    return original(port_args, server_args, {**scheduler_info, LAUNCH_DATA_KEY: WorkerLoad()}, *args, **kwargs)
