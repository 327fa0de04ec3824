"""The `vradix` command line and the clients' API key: one console script with a subcommand per tool, its version
from the one version source, and the key SGLang's servers expect (`Authorization: Bearer`), sent by the publish client
and the inspector, with errors that name the server that refused."""
import http.server
import json
import subprocess
import sys
import threading

import pytest

from vradix import __version__, cli, inspector
from vradix.client import EngineHandle, publish


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "vradix.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_version_and_help_name_every_command():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"vradix {__version__} (for sglang 0.5.23)"
    out = run_cli("--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for name, (_, what) in cli.COMMANDS.items():
        assert f"{name} {' '.join(what.split())[:40]}" in text, name


@pytest.mark.parametrize("command,usage", [("inspect", "usage: vradix inspect"), ("publish", "usage: vradix publish"),
                                           ("l3", "usage: vradix l3")])
def test_each_command_explains_itself_under_its_own_name(command, usage):
    out = run_cli(command, "--help")
    assert out.returncode == 0 and out.stdout.startswith(usage), out.stdout[:200]


def test_an_unknown_command_is_refused_with_the_list():
    out = run_cli("inspector")
    assert out.returncode == 2 and "invalid choice: 'inspector'" in out.stderr and "'inspect'" in out.stderr


class KeyedServer(http.server.BaseHTTPRequestHandler):
    """A server that, like SGLang started with `--api-key k`, answers 401 without `Authorization: Bearer k`."""

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != "Bearer k":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": "Unauthorized"}')
            return
        body = json.dumps({"weight_version": "v1"} if self.path == "/model_info" else
                          {"top_prefixes": [], "epochs": []}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def keyed_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeyedServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_publish_client_sends_the_key_and_names_the_server_that_refused(keyed_url):
    assert EngineHandle(keyed_url, timeout=10).authorize("k").label() == "v1"
    with pytest.raises(RuntimeError) as refused:
        EngineHandle(keyed_url, timeout=10).label()
    assert str(refused.value).startswith(f"{keyed_url}: GET /model_info -> HTTP 401")
    assert "pass --api-key or set VRADIX_API_KEY" in str(refused.value)
    with pytest.raises(RuntimeError, match=f"{keyed_url}: GET /get_server_info -> HTTP 401"):
        publish(keyed_url, "/no/such/model", "v2", timeout=10)  # refused before anything changed


def test_the_inspector_takes_the_key_from_the_flag_or_the_environment(keyed_url, monkeypatch):
    with pytest.raises(inspector.InspectError):
        inspector.fetch(keyed_url)
    assert inspector.fetch(keyed_url, api_key="k")["top_prefixes"] == []
    monkeypatch.setenv("VRADIX_API_KEY", "k")
    assert inspector.parser().parse_args(["--url", keyed_url]).api_key == "k"
