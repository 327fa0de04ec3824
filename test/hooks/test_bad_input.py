"""Bad input at the unit level (no server): publication labels, user keys against the epoch namespace, and a property
test that the namespace encoding cannot be collided with by any accepted user key. The same inputs are sent to a real
server in `test_fault_injection.py`."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vradix import identity
from vradix.core.epochs import MAX_LABEL_CHARS, InvalidLabelError, check_label
from vradix.engine import attach
from vradix.identity import ReservedNamespaceError
from vradix.testing.harness.cache_fixture import build_cache


@pytest.mark.parametrize("label", [None, "v1", "step-000123", "ü-ß", "x" * MAX_LABEL_CHARS])
def test_valid_labels(label):
    check_label(label)


# an empty or oversized label is refused, not published (a label is echoed in every response)
@pytest.mark.parametrize("label,why", [("", "empty"), ("x" * (MAX_LABEL_CHARS + 1), "at most"),
                                       ("x" * 100_000, "at most"), ("v1\n", "control"), ("\x1evradix:e1", "control"),
                                       (123, "expected a string"), (["v1"], "expected a string")])
def test_invalid_labels_are_refused_with_a_clear_error(label, why):
    with pytest.raises(InvalidLabelError, match=why):
        check_label(label)


# the reserved marker is refused in every user key, `cache_salt` as well as `extra_key`
@pytest.mark.parametrize("field", ["extra_key", "cache_salt"])
def test_reserved_marker_is_refused_in_every_user_key(field):
    fx = build_cache("rust", 1, kv_tokens=64, max_reqs=2)
    state = attach(fx.cache)
    req = fx.make_req([1, 2, 3])
    setattr(req, field, identity.namespace(state.weight_id))
    with pytest.raises(ReservedNamespaceError, match="reserved vradix epoch marker"):
        state.admit_or_raise(req)


weight_ids = st.one_of(st.just("nonce:0"), st.just("fp:0"),
                       st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1,
                               max_size=12).map(lambda t: identity.declared(t).weight_id))
epochs = st.one_of(st.none(), st.integers(0, 10**6))
user_keys = st.one_of(st.none(), st.text(st.characters(blacklist_characters="\x1e"), max_size=12))


@settings(max_examples=500, deadline=None, database=None, derandomize=True)
@given(w1=weight_ids, e1=epochs, u1=user_keys, w2=weight_ids, e2=epochs, u2=user_keys)
def test_namespace_encoding_is_injective(w1, e1, u1, w2, e2, u2):
    """No accepted user key or declared identity makes two different (weight_id, epoch suffix, user key) triples
    share a namespace string, and the prefix read back from a stamped key is the namespace it was stamped with."""
    for u in (u1, u2):
        identity.check_user_key(u)
    p1, p2 = identity.namespace(w1, e1), identity.namespace(w2, e2)
    k1, k2 = identity.stamped(p1, u1), identity.stamped(p2, u2)
    assert identity.prefix_of(k1) == p1
    if (w1, e1, u1 or "") != (w2, e2, u2 or ""):
        assert k1 != k2
