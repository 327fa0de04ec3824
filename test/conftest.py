"""Shared fixtures. The vradix plugin is loaded through SGLang's own `load_plugins()`, so every test process runs
the real hooks on SGLang's real functions, exactly as a scheduler process does."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("VRADIX_DISABLE", None)

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: starts real SGLang CPU servers (slow)")
