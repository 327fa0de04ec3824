"""Bad input at the unit level (no server): publication labels, user keys against the epoch namespace, and a property
test that the namespace encoding cannot be collided with by any accepted user key. The same inputs are sent to a real
server in `test_fault_injection.py`."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vradix import namespace
from vradix.admission import stamp
from vradix.namespace import ReservedNamespaceError
from vradix.epochs import MAX_LABEL_CHARS, InvalidLabelError, check_label
from vradix.state import attach
from vradix.testing.cache_fixture import build_cache


@pytest.mark.parametrize("label", [None, "v1", "step-000123", "ü-ß", "x" * MAX_LABEL_CHARS])
def test_valid_labels(label):
    check_label(label)


# regression: before the fix, "" and a 100k-character label were published (and echoed in every response)
@pytest.mark.parametrize("label,why", [("", "empty"), ("x" * (MAX_LABEL_CHARS + 1), "at most"),
                                       ("x" * 100_000, "at most"), ("v1\n", "control"), ("\x1evradix:e1", "control"),
                                       (123, "expected a string"), (["v1"], "expected a string")])
def test_invalid_labels_are_refused_with_a_clear_error(label, why):
    with pytest.raises(InvalidLabelError, match=why):
        check_label(label)


# regression: a cache_salt carrying the reserved marker was accepted
@pytest.mark.parametrize("field", ["extra_key", "cache_salt"])
def test_reserved_marker_is_refused_in_every_user_key(field):
    fx = build_cache("rust", 1, kv_tokens=64, max_reqs=2)
    state = attach(fx.cache)
    req = fx.make_req([1, 2, 3])
    setattr(req, field, namespace.namespace(0))
    with pytest.raises(ReservedNamespaceError, match="reserved vradix epoch marker"):
        stamp(state, req)


user_keys = st.one_of(st.none(), st.text(st.characters(blacklist_characters="\x1e"), max_size=12))


@settings(max_examples=500, deadline=None, database=None, derandomize=True)
@given(e1=st.integers(0, 10**6), u1=user_keys, e2=st.integers(0, 10**6), u2=user_keys)
def test_namespace_encoding_is_injective(e1, u1, e2, u2):
    """No accepted user key makes two different (epoch, user key) pairs share a namespace string."""
    for u in (u1, u2):
        namespace.check_user_key(u)
    k1, k2 = namespace.stamped(e1, u1), namespace.stamped(e2, u2)
    assert namespace.epoch_of(k1) == e1
    if (e1, u1 or "") != (e2, u2 or ""):
        assert k1 != k2
