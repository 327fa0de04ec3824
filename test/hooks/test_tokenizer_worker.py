"""SGLang's multi-tokenizer workers load vradix before they serve, or stop (`vradix.hooks.tokenizer_worker`).

Each case runs in a fresh interpreter where vradix is not installed, as a worker process starts: the app the HTTP
workers import (`vradix.plugin:tokenizer_worker_app`, through uvicorn's own importer) and the launch data every
tokenizer worker unpickles (as `Engine.attach_tokenizer_worker` reads it in another process). The E2E run of the
HTTP workers is test/e2e/test_tokenizer_workers.py."""
import os
import pickle
import subprocess
import sys

from vradix import __version__
from vradix.hooks import tokenizer_worker
from vradix.settings import CHAINED_APP_PATH_ENV, TOKENIZER_WORKER_APP


def run_python(code: str, stdin: bytes = b"", **env) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("VRADIX_", "SGLANG_PLUGINS"))}
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, timeout=300, env=e)


LAUNCH_DATA = pickle.dumps(({"max_req_input_len": 1, tokenizer_worker.LAUNCH_DATA_KEY: tokenizer_worker.WorkerLoad()}))

READ_LAUNCH_DATA = """
import pickle, sys
import vradix.plugin
assert not vradix.plugin.installed()
info = pickle.loads(sys.stdin.buffer.read())
print("INSTALLED" if vradix.plugin.installed() else "NOT-INSTALLED", info)
"""


def test_reading_the_launch_data_installs_vradix_in_the_reading_process():
    out = run_python(READ_LAUNCH_DATA, LAUNCH_DATA)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().startswith(f"INSTALLED {{'max_req_input_len': 1, "
                                          f"'{tokenizer_worker.LAUNCH_DATA_KEY}': 'vradix {__version__} installed'}}")
    assert "hooks installed in tokenizer worker" in out.stderr.decode()


WORKER_WITHOUT_VRADIX = """
import pickle, sys
from uvicorn.importer import import_from_string
data = sys.stdin.buffer.read()
for name, load in (("launch data", lambda: pickle.loads(data)),
                   ("app", lambda: import_from_string("%s"))):
    try:
        load()
        print(name, "SERVES-UNVERSIONED")
    except SystemExit as e:
        print(name, "STOPPED:", e)
""" % TOKENIZER_WORKER_APP


def test_a_worker_where_vradix_cannot_install_stops_before_it_serves():
    """SGLANG_PLUGINS leaves vradix out in the worker: both ways in stop it, naming vradix and the cause."""
    out = run_python(WORKER_WITHOUT_VRADIX, LAUNCH_DATA, SGLANG_PLUGINS="some_other_plugin")
    lines = out.stdout.decode().splitlines()
    assert out.returncode == 0 and len(lines) == 2, out.stderr.decode()[-2000:]
    for name, line in zip(("launch data", "app"), lines):
        assert line.startswith(f"{name} STOPPED: vradix {__version__} is active in the launcher but not installed in "
                               "this tokenizer worker (pid "), line
        assert "SGLANG_PLUGINS='some_other_plugin' leaves it out" in line
        assert "refusing to serve an unversioned radix cache" in line


def test_the_launcher_names_vradix_app_only_for_several_workers(monkeypatch):
    class Args:
        tokenizer_worker_num = 1

    monkeypatch.delenv(tokenizer_worker.APP_PATH_ENV, raising=False)
    monkeypatch.delenv(CHAINED_APP_PATH_ENV, raising=False)
    tokenizer_worker.name_vradix_worker_app(Args())
    assert tokenizer_worker.APP_PATH_ENV not in os.environ
    Args.tokenizer_worker_num = 2
    monkeypatch.setenv(tokenizer_worker.APP_PATH_ENV, "my_server:app")
    tokenizer_worker.name_vradix_worker_app(Args())
    tokenizer_worker.name_vradix_worker_app(Args())  # twice (a relaunch in one process): the chain is kept
    assert os.environ[tokenizer_worker.APP_PATH_ENV] == TOKENIZER_WORKER_APP
    assert os.environ[CHAINED_APP_PATH_ENV] == "my_server:app"
