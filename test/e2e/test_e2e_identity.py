"""E2E: the weight identity on a real CPU server (no HiCache needed to see it): in `declared` mode the startup
`--weight-version` and each publication's label are the identity, a reused declaration is refused (HTTP 400) on
every publication path and changes nothing; in `fingerprint` mode equal weights get equal identities, across two
servers and across publications. The L3 consequences are in `test_e2e_hicache.py`."""
import pytest
import requests

from vradix.testing.harness.scenario import PROBE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def identity_of(s):
    v = s.vradix_info()
    return v["weight_id"], v["weight_identity"], v["epoch"], v["label"]


DECLARED_FLAGS = ["--vradix-weight-identity", "declared", "--weight-version", "run1-step0"]
FINGERPRINT_FLAGS = ["--vradix-weight-identity", "fingerprint"]


@pytest.fixture(scope="module")
def prestarted(models, server_pool):
    """The module's three servers start together: one declared `run1-step0`, two with fingerprint identities; each
    waits parked in the pool (taking no CPU) until its tests lease it."""
    server_pool.prestart((models[0], dict(extra_args=DECLARED_FLAGS)),
                         *[(models[0], dict(extra_args=FINGERPRINT_FLAGS))] * 2)


@pytest.fixture(scope="module")
def declared(models, server_pool, prestarted):
    with server_pool.lease(models[0], once=True, extra_args=DECLARED_FLAGS) as s:
        yield s


@pytest.fixture
def fingerprinted(models, server_pool, prestarted):
    with server_pool.lease_many(2, models[0], once=True, extra_args=FINGERPRINT_FLAGS) as pair:
        yield pair


def test_startup_and_publications_carry_the_declared_identity(declared, models):
    s = declared
    assert identity_of(s)[:2] == ("declared:run1-step0", {"mode": "declared", "source": "declared"})
    r = s.post("/update_weights_from_disk", {"model_path": models[1], "weight_version": "run1-step1"})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert "weight_id=declared:run1-step1" in r.json()["message"]
    assert identity_of(s)[0] == "declared:run1-step1"
    meta = s.generate(PROBE, 2)["meta_info"]
    assert meta["prefix_cache"]["weight_id"] == "declared:run1-step1"


def test_a_reused_declaration_is_refused_on_every_path_and_changes_nothing(declared, models):
    s = declared
    before = identity_of(s)
    used = "run1-step0"  # the startup identity
    r = s.post("/update_weights_from_disk", {"model_path": models[0], "weight_version": used})
    assert r.status_code == 400 and "already used by an earlier publication" in r.text
    assert identity_of(s) == before
    r = s.post("/update_weight_version", {"new_version": used})
    assert r.status_code == 400 and "already used by an earlier publication" in r.text
    assert identity_of(s) == before
    assert requests.get(s.url + "/model_info", timeout=30).json()["weight_version"] == before[3]  # launcher's too
    r = s.post("/update_weight_version", {"new_version": "run1-step2"})  # a new declaration is a publication
    assert r.status_code == 200 and identity_of(s)[0] == "declared:run1-step2"


def test_fingerprint_identities_are_equal_for_equal_weights_across_servers_and_publications(fingerprinted, models):
    """Two servers started on the same checkpoint prove the same identity; publishing other weights changes it;
    publishing the first weights again brings it back (the same bytes, the same proof)."""
    s1, s2 = fingerprinted
    (a1, how, _, _), (a2, _, _, _) = identity_of(s1), identity_of(s2)
    assert a1 == a2 and a1.startswith("fp:") and how == {"mode": "fingerprint", "source": "fingerprint"}
    assert s1.post("/update_weights_from_disk", {"model_path": models[1]}).json()["success"]
    b = identity_of(s1)[0]
    assert b.startswith("fp:") and b != a1
    assert s1.post("/update_weights_from_disk", {"model_path": models[0]}).json()["success"]
    assert identity_of(s1)[0] == a1
