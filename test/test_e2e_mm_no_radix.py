"""E2E on real SGLang CPU servers with a tiny Qwen2-VL and `--disable-radix-cache`: a publication still drops the
image embeddings the old vision tower computed (SGLang's multimodal embedding cache is on without a radix cache).

A and B (`vradix.testing.tiny_vl_model`) share the language model and differ in the vision tower, so for the same
prompt and image an answer is B's exactly when the embedding was computed by B's tower. Two servers start together,
both with the radix cache off: a stock one on B (its first answer is the fresh-B oracle) and a vradix one on A (its
first answer is the fresh-A oracle). The stock server, published to A, still answers B's answer (the bug); the
vradix server, published to B, answers the fresh-B oracle, and published to A again, the fresh-A one. An
encoder-only (EPD) launch does not start with vradix active.
"""
import pytest

from vradix.testing import vlm_aids
from vradix.testing.server import CpuServer, ServerDied, start_servers
from vradix.testing.tiny_vl_model import IMAGE_PROMPT, generate, write_image

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

NO_RADIX = ["--disable-radix-cache"]


@pytest.fixture(scope="module")
def vl_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl_models_no_radix")
    return generate(str(d / "A"), seed=1), generate(str(d / "B"), seed=1, vision_seed=2)


def vl_server(model, vradix):
    return lambda: CpuServer(model, vradix=vradix, extra_args=NO_RADIX, skip_tokenizer_init=False,
                             env=vlm_aids.server_env(), max_total_tokens=4096, startup_timeout=300)


def ask(server, image) -> list:
    r = server.post("/generate", {"text": IMAGE_PROMPT, "image_data": image,
                                  "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()["output_ids"]


def publish(server, model, version) -> None:
    out = server.post("/update_weights_from_disk", {"model_path": model, "weight_version": version}).json()
    assert out["success"], out


def test_without_radix_cache_a_publication_recomputes_image_embeddings(vl_models, tmp_path):
    model_a, model_b = vl_models
    image = write_image(str(tmp_path / "image.png"), seed=0)
    stock_on_b, vradix_on_a = start_servers(vl_server(model_b, vradix=False), vl_server(model_a, vradix=True))
    try:
        fresh_b, fresh_a = ask(stock_on_b, image), ask(vradix_on_a, image)
        assert fresh_a != fresh_b, "the two vision towers must give different answers for this image"

        publish(stock_on_b, model_a, "A")
        assert ask(stock_on_b, image) == fresh_b  # stock SGLang: B's cached embedding fed to A (the bug this guards)

        publish(vradix_on_a, model_b, "B")
        assert ask(vradix_on_a, image) == fresh_b, "vradix reused A's image embedding after publishing B"
        info = vradix_on_a.vradix_info()
        assert info["radix_cache"] is False and info["last_publication"]["mm_embeddings_cleared"] == 1
        publish(vradix_on_a, model_a, "A2")
        assert ask(vradix_on_a, image) == fresh_a
        assert "Traceback" not in vradix_on_a.logs()
    finally:
        stock_on_b.stop()
        vradix_on_a.stop()


@pytest.mark.long  # duplicate coverage: test_weight_derived.py drives the same refusal on SGLang's real MMEncoder
def test_an_encoder_only_launch_does_not_start(vl_models):
    """`--encoder-only` skips `check_server_args`: the real launch reaches the encoder server, which vradix stops
    before it builds its encoder (the in-process check is `test_weight_derived.py`)."""
    with pytest.raises(ServerDied) as e:
        CpuServer(vl_models[0], extra_args=["--encoder-only"], skip_tokenizer_init=False, env=vlm_aids.server_env(),
                  startup_timeout=200)
    assert "vradix refuses --encoder-only" in str(e.value) and "without encoder disaggregation" in str(e.value)
