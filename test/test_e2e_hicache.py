"""E2E: the KV page ledger and its strict guard stay on with HiCache, on a real SGLang CPU server with a host pool
(`--enable-hierarchical-cache`, CPU aids from `vradix.testing.cpu_aids`), and a prefix demoted to the host pool and
loaded back is verified and reused with unchanged output."""
import pytest

from vradix.testing.server import CpuServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PROMPT = [(i * 7) % 480 + 20 for i in range(600)]
#: distinct ~700-token prompts: together they overflow the 4096-token device pool, demoting PROMPT to host
FLOOD = [[(i * 37 + j * 11) % 490 + 10 for j in range(700)] for i in range(1, 8)]


def test_ledger_verifies_a_prefix_loaded_back_from_the_host_pool(models):
    with CpuServer(models[0], extra_args=["--enable-hierarchical-cache", "--hicache-ratio", "2"],
                   max_total_tokens=4096) as s:
        assert "KV page ledger on" in s.logs() and "KV page ledger disabled" not in s.logs()
        ledger = s.vradix_info()["kv_ledger"]
        assert ledger["enabled"] and ledger["verify_mode"] == "strict"
        first = s.generate(PROMPT, 4)
        assert first["meta_info"]["cached_tokens"] == 0
        for prompt in FLOOD:
            s.generate(prompt, 1)
        verified_before = s.vradix_info()["kv_ledger"]["prefixes_verified"]

        again = s.generate(PROMPT, 4)
        details = again["meta_info"]["cached_tokens_details"]
        assert details and details["host"] > 0, again["meta_info"]  # demoted to host, loaded back
        assert again["output_ids"] == first["output_ids"]
        ledger = s.vradix_info()["kv_ledger"]
        assert ledger["violations_caught"] == 0, ledger["last_violation"]
        assert ledger["prefixes_verified"] > verified_before  # the loaded-back prefix itself was verified
        assert "Traceback" not in s.logs()
