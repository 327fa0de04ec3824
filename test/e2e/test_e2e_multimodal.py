"""E2E on a real SGLang CPU server with a tiny Qwen2-VL: a publication does not reuse image embeddings computed by the
old vision tower (SGLang keys its multimodal embedding cache by image content only), and a flush drops them too.

A and B (`vradix.testing.models.vl`) have the same language model and different vision towers. So, for the same
prompt and image, the server answers differently on B than on A exactly when it recomputed the image's embedding:
a cached A embedding fed to B's (identical) language model gives A's answer, token for token. Publishing A again must
give A's first answer back (the embedding recomputed by A's tower). One server serves both radix-cache tests (leased
from the session's server pool, reset between them).

Without a radix cache (`--disable-radix-cache`) SGLang still keeps the embedding cache, and vradix still drops it at
every publication: two servers, both with the radix cache off (all three start together when the module starts), a stock one on B (its first answer is
the fresh-B oracle) and a vradix one on A (its first answer is the fresh-A oracle). The stock server, published to A,
still answers B's answer (the bug); the vradix server, published to B, answers the fresh-B oracle, and published to A
again, the fresh-A one. An encoder-only (EPD) launch does not start with vradix active (a long profile).
"""
import pytest

from vradix.testing.cpu_aids import vlm
from vradix.testing.harness.server import CpuServer, ServerDied
from vradix.testing.models.vl import IMAGE_PROMPT, generate, write_image

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


NO_RADIX = ["--disable-radix-cache"]


@pytest.fixture(scope="module")
def vl_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vl_models")
    return generate(str(d / "A"), seed=1), generate(str(d / "B"), seed=1, vision_seed=2)


def vl_server(vradix: bool = True, radix: bool = True) -> dict:
    """`CpuServer` keyword arguments of a VL server (its tokenizer and processor, the VLM CPU aid)."""
    return dict(vradix=vradix, extra_args=[] if radix else NO_RADIX, skip_tokenizer_init=False, env=vlm.server_env(),
                max_total_tokens=4096, startup_timeout=600)


@pytest.fixture(scope="module")
def prestarted(vl_models, server_pool):
    """The module's three servers start together, parked in the pool (taking no CPU) until their tests: vradix on A
    with a radix cache, and without one stock on B and vradix on A."""
    model_a, model_b = vl_models
    server_pool.prestart((model_a, vl_server()), (model_b, vl_server(vradix=False, radix=False)),
                         (model_a, vl_server(radix=False)))


@pytest.fixture
def server(vl_models, server_pool, prestarted):
    """The vradix VL server on A, leased per test from the pool (reset between tests: on A, cache flushed)."""
    with server_pool.lease(vl_models[0], **vl_server()) as s:
        yield s
        assert "Traceback" not in s.logs()


def ask(server, image) -> list:
    r = server.post("/generate", {"text": IMAGE_PROMPT, "image_data": image,
                                  "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()["output_ids"]


def publish(server, model, version) -> dict:
    out = server.post("/update_weights_from_disk", {"model_path": model, "weight_version": version}).json()
    assert out["success"], out
    return server.vradix_info()


def test_a_publication_recomputes_image_embeddings(server, vl_models, tmp_path):
    model_a, model_b = vl_models
    image = write_image(str(tmp_path / "image.png"), seed=0)
    on_a = ask(server, image)
    held = server.vradix_info().get("mm_embedding_cache")

    v = publish(server, model_b, "B")
    on_b = ask(server, image)
    assert on_b != on_a, "B answered with A's image embedding (the cached one), not with B's vision tower"
    assert held["entries"] == 1
    assert v["last_publication"]["mm_embeddings_cleared"] == 1 and v["mm_embedding_cache"]["entries"] == 0

    v = publish(server, model_a, "A2")
    assert v["last_publication"]["mm_embeddings_cleared"] == 1
    assert ask(server, image) == on_a  # A's tower again: A's first answer, token for token
    assert ask(server, image) == on_a  # and from the cache, now filled under A2


def test_a_flush_drops_image_embeddings(server, tmp_path):
    ask(server, write_image(str(tmp_path / "other.png"), seed=1))
    held = server.vradix_info()["mm_embedding_cache"]["entries"]
    assert held >= 1
    assert server.post("/flush_cache").status_code == 200
    v = server.vradix_info()
    assert v["last_invalidation_detail"]["mm_embeddings_cleared"] == held and v["mm_embedding_cache"]["entries"] == 0


def test_without_radix_cache_a_publication_recomputes_image_embeddings(vl_models, tmp_path, server_pool,
                                                                       prestarted):
    model_a, model_b = vl_models
    image = write_image(str(tmp_path / "image.png"), seed=0)
    with server_pool.lease(model_b, once=True, **vl_server(vradix=False, radix=False)) as stock_on_b, \
            server_pool.lease(model_a, once=True, **vl_server(radix=False)) as vradix_on_a:
        assert "active without a radix cache: no prefix tree to version" in vradix_on_a.logs()
        fresh_b, fresh_a = ask(stock_on_b, image), ask(vradix_on_a, image)
        assert fresh_a != fresh_b, "the two vision towers must give different answers for this image"

        publish(stock_on_b, model_a, "A")
        assert ask(stock_on_b, image) == fresh_b  # stock SGLang: B's cached embedding fed to A (the bug this guards)

        publish(vradix_on_a, model_b, "B")
        assert ask(vradix_on_a, image) == fresh_b, "vradix reused A's image embedding after publishing B"
        info = vradix_on_a.vradix_info()
        assert info["active"] is True and info["radix_cache"] is False and info["publications"] == 1
        assert info["last_publication"]["mm_embeddings_cleared"] == 1
        publish(vradix_on_a, model_a, "A2")
        assert ask(vradix_on_a, image) == fresh_a
        assert "Traceback" not in vradix_on_a.logs()


@pytest.mark.long  # duplicate coverage: test_weight_derived.py drives the same refusal on SGLang's real MMEncoder
def test_an_encoder_only_launch_does_not_start(vl_models):
    """`--encoder-only` skips `check_server_args`: the real launch reaches the encoder server, which vradix stops
    before it builds its encoder (the in-process check is `test_weight_derived.py`)."""
    with pytest.raises(ServerDied) as e:
        CpuServer(vl_models[0], extra_args=["--encoder-only"], skip_tokenizer_init=False, env=vlm.server_env(),
                  startup_timeout=200)
    assert "vradix refuses --encoder-only" in str(e.value) and "without encoder disaggregation" in str(e.value)
