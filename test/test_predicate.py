"""The one predicate: pause mode and radix sharing derived together; unsafe combinations rejected."""
import itertools

import pytest

from vradix.predicate import Deployment, Plan, UnsafeDeployment, derive


def plan(**kw) -> Plan:
    return derive(Deployment(**kw))


def test_vradix_disjoint_keeps_in_flight_kv_and_shares_prefixes():
    p = plan(vradix=True)
    assert (p.pause_mode, p.radix_enabled, p.flush) == ("in_place", True, False)
    assert plan(vradix=True, disable_radix_cache=False).radix_enabled
    assert not plan(vradix=True, disable_radix_cache=True).radix_enabled


def test_stock_disjoint_default_is_in_place_without_radix():
    p = plan()
    assert (p.pause_mode, p.radix_enabled, p.flush) == ("in_place", False, False)
    assert p.disable_radix_cache is True


def test_stock_sharing_requires_retract_and_flush():
    for kw in ({"prefer_sharing": True}, {"disable_radix_cache": False}, {"pause_mode": "retract"}):
        p = plan(**kw)
        assert (p.pause_mode, p.radix_enabled, p.flush) == ("retract", True, True), kw


def test_radix_with_in_place_without_vradix_is_rejected():
    with pytest.raises(UnsafeDeployment, match="rule 4: radix cache with an in_place pause"):
        plan(disable_radix_cache=False, pause_mode="in_place")
    # the same request is fine once vradix versions the cache
    assert plan(vradix=True, disable_radix_cache=False, pause_mode="in_place").radix_enabled


def test_colocated_retracts_and_rejects_in_place():
    p = plan(colocated=True)
    assert (p.pause_mode, p.radix_enabled, p.flush) == ("retract", True, True)
    assert plan(colocated=True, vradix=True).flush is False  # vradix invalidates at the bump
    with pytest.raises(UnsafeDeployment, match="rule 2"):
        plan(colocated=True, pause_mode="in_place")


def test_pd_cannot_retract_and_shares_only_with_vradix_on_the_role():
    p = plan(pd_disaggregated=True)
    assert (p.pause_mode, p.radix_enabled) == ("in_place", False)
    with pytest.raises(UnsafeDeployment, match="retract is not supported with P/D"):
        plan(pd_disaggregated=True, pause_mode="retract")
    with pytest.raises(UnsafeDeployment, match="rule 1: disable_radix_cache=False on a P/D deployment without"):
        plan(pd_disaggregated=True, disable_radix_cache=False)
    # vradix namespaces the role's tree and its handshake refuses KV of other weights: a running role's radix is kept
    p = plan(pd_disaggregated=True, vradix=True, disable_radix_cache=False)
    assert (p.pause_mode, p.radix_enabled, p.flush) == ("in_place", True, False)
    with pytest.raises(UnsafeDeployment, match="retract is not supported with P/D"):
        plan(pd_disaggregated=True, vradix=True, pause_mode="retract")


def test_lora_shares_only_when_radix_is_keyed_by_adapter():
    assert plan(lora=True, prefer_sharing=True).radix_enabled  # SGLang 0.5.23 keys radix by lora_id
    assert not plan(lora=True, prefer_sharing=True, lora_scoped_radix=False).radix_enabled
    with pytest.raises(UnsafeDeployment, match="rule 5"):
        plan(lora=True, disable_radix_cache=False, lora_scoped_radix=False)
    assert plan(lora=True, vradix=True, lora_scoped_radix=False).radix_enabled


def test_unknown_pause_mode_is_rejected():
    with pytest.raises(UnsafeDeployment, match="unknown pause_mode"):
        plan(pause_mode="abort")


@pytest.mark.parametrize("combo", list(itertools.product(
    [False, True], [False, True], [False, True], [False, True], [None, False, True], [None, "in_place", "retract"],
    [False, True])))
def test_every_accepted_plan_is_safe(combo):
    """Over the whole input space: whatever the predicate accepts never shares a prefix cache that can hold KV of
    old weights after a publication."""
    colocated, pd, lora, vradix, disable, mode, prefer = combo
    d = Deployment(colocated=colocated, pd_disaggregated=pd, lora=lora, vradix=vradix, disable_radix_cache=disable,
                   pause_mode=mode, prefer_sharing=prefer)
    try:
        p = derive(d)
    except UnsafeDeployment as e:
        assert str(e)  # rejected with a message
        return
    assert p.pause_mode in ("in_place", "retract")
    if mode is not None:
        assert p.pause_mode == mode  # an explicit choice is honoured or rejected, never silently changed
    if disable is True:
        assert not p.radix_enabled
    if pd:
        assert p.pause_mode == "in_place" and (vradix or not p.radix_enabled)
    if colocated:
        assert p.pause_mode == "retract"
    if p.radix_enabled and not vradix:
        assert p.pause_mode == "retract" and p.flush  # stock sharing needs retract + flush
    if disable is False and not p.radix_enabled:
        pytest.fail(f"explicit disable_radix_cache=False silently turned off: {d} -> {p}")


def test_client_reads_unknown_radix_state_as_enabled():
    """XoRL's bug: an endpoint that does not report its radix state must not skip invalidation."""
    from vradix.client import deployment_of

    stock_unknown = deployment_of({}, [None])
    assert stock_unknown.disable_radix_cache is False and not stock_unknown.vradix
    assert derive(stock_unknown).pause_mode == "retract" and derive(stock_unknown).flush
    assert derive(deployment_of({"disable_radix_cache": True}, [None])).flush is False
    on_vradix = deployment_of({"disable_radix_cache": False}, [{"active": True, "epoch": 3}])
    assert on_vradix.vradix and derive(on_vradix).pause_mode == "in_place"
    # one DP rank without an active vradix block makes the whole engine "not vradix"
    assert not deployment_of({}, [{"active": True}, None]).vradix
    assert deployment_of({"disaggregation_mode": "prefill"}, [None]).pd_disaggregated
