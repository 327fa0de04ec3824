"""The one predicate: pause mode and radix sharing, derived together from the deployment.

Prefix reuse is safe exactly where no KV computed under old weights can be matched after a publication:
- with vradix, the epoch namespace guarantees it for any pause mode (in-flight KV is kept, never inserted);
- without vradix, only a `retract` pause followed by a flush guarantees it (nothing may hold KV at the flush).

Rules (first match decides; `UnsafeDeployment` names the rule it violates):
1. P/D disaggregation cannot retract (so it cannot be colocated either, see 2) (the prefill and decode groups cannot
   re-prefill a migrated request): pause `in_place`. The PD protocol of SGLang 0.5.23 carries no weight version, so
   without vradix radix sharing on a P/D role is off and an explicit `disable_radix_cache=False` is rejected. With
   vradix on the role its own tree is epoch-namespaced and a vradix decode commits transferred KV only when prefill's
   weight identity matches its own (`vradix.pd.handshake`), so radix sharing is on unless disabled, as in rule 3.
2. A colocated engine releases its KV memory at every publication, so in-flight requests cannot keep their KV:
   pause `retract`. An explicit `in_place` is rejected.
3. With vradix: radix sharing on (unless explicitly disabled), pause `in_place` for a disjoint engine (keeps
   in-flight KV), no flush needed.
4. Without vradix: radix sharing only with `retract` + flush. A disjoint engine keeps `in_place` and radix off unless
   it opts in with `prefer_sharing=True` (then `retract` + flush). `disable_radix_cache=False` together with
   `in_place` is rejected.
5. LoRA without vradix shares prefixes only if the engine keys radix entries by adapter (`lora_scoped_radix`, true for
   SGLang 0.5.23); otherwise radix is off and an explicit `disable_radix_cache=False` is rejected.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PAUSE_MODES = ("in_place", "retract")


class UnsafeDeployment(ValueError):
    """The requested combination can serve KV computed under old weights after a publication."""


@dataclass(frozen=True)
class Deployment:
    colocated: bool = False
    pd_disaggregated: bool = False
    lora: bool = False
    vradix: bool = False
    #: None = not set by the user (derive it); True/False = explicit
    disable_radix_cache: Optional[bool] = None
    #: None = derive; "in_place" / "retract" = explicit
    pause_mode: Optional[str] = None
    #: a disjoint engine without vradix: trade in-flight KV for prefix reuse (retract + flush at each publication)
    prefer_sharing: bool = False
    #: the engine keys radix entries by LoRA adapter (SGLang 0.5.23 does: lora_id suffix of extra_key)
    lora_scoped_radix: bool = True


@dataclass(frozen=True)
class Plan:
    pause_mode: str
    radix_enabled: bool
    #: flush the prefix cache after the retracting pause, before continuing (stock engines with radix on)
    flush: bool
    reason: str

    @property
    def disable_radix_cache(self) -> bool:
        return not self.radix_enabled


def derive(d: Deployment) -> Plan:
    """Pause mode and radix sharing for deployment `d`, or `UnsafeDeployment` with the violated rule."""
    if d.pause_mode is not None and d.pause_mode not in PAUSE_MODES:
        raise UnsafeDeployment(f"unknown pause_mode {d.pause_mode!r}; expected one of {PAUSE_MODES}")
    explicit_radix = d.disable_radix_cache is False

    if d.pd_disaggregated:
        if d.colocated:
            raise UnsafeDeployment("rules 1+2: a colocated P/D deployment must release KV memory at publication "
                                   "(retract) but P/D requests cannot be retracted; run P/D engines disjoint")
        if d.pause_mode == "retract":
            raise UnsafeDeployment("rule 1: retract is not supported with P/D (prefill/decode) groups: a "
                                   "disaggregated request cannot be retracted; use pause_mode='in_place'")
        if d.vradix:
            return Plan("in_place", d.disable_radix_cache is not True, False,
                        "P/D with vradix: in_place pause, epoch-namespaced radix, weight-identity handshake")
        if explicit_radix:
            raise UnsafeDeployment("rule 1: disable_radix_cache=False on a P/D deployment without vradix: the PD "
                                   "protocol carries no weight epoch, so decode could reuse KV prefilled under other "
                                   "weights")
        return Plan("in_place", False, False, "P/D: in_place pause, radix off (no epoch in the PD protocol)")

    if d.colocated:
        if d.pause_mode == "in_place":
            raise UnsafeDeployment("rule 2: in_place on a colocated engine: its KV memory is released at every "
                                   "publication, so in-flight requests cannot keep their KV; use 'retract'")
        radix = _radix_allowed(d, pause_mode="retract")
        return Plan("retract", radix, radix and not d.vradix,
                    "colocated: retract (KV memory is released)" + ("" if radix else ", radix off"))

    if d.vradix:
        radix = d.disable_radix_cache is not True
        mode = d.pause_mode or "in_place"
        return Plan(mode, radix, False, f"vradix: epoch-namespaced radix, {mode} pause, no flush needed")

    # disjoint engine without vradix
    mode = d.pause_mode or ("retract" if (d.prefer_sharing or explicit_radix) else "in_place")
    radix = _radix_allowed(d, pause_mode=mode)
    if mode == "in_place":
        return Plan("in_place", False, False, "disjoint without vradix: in_place keeps in-flight KV, so radix off")
    return Plan("retract", radix, radix,
                "disjoint without vradix: retract + flush at each publication" + ("" if radix else ", radix off"))


def _radix_allowed(d: Deployment, *, pause_mode: str) -> bool:
    """Radix sharing for an engine that is not P/D, given the pause mode it will use."""
    if d.disable_radix_cache is True:
        return False
    if not d.vradix and pause_mode == "in_place":
        if d.disable_radix_cache is False:
            raise UnsafeDeployment("rule 4: radix cache with an in_place pause on an engine without vradix: "
                                   "prefixes cached under old weights stay matchable after the publication "
                                   "(and a flush is refused while paused requests hold KV); install vradix or use "
                                   "pause_mode='retract'")
        return False
    if d.lora and not d.vradix and not d.lora_scoped_radix:
        if d.disable_radix_cache is False:
            raise UnsafeDeployment("rule 5: LoRA with a radix cache that is not keyed by adapter: one adapter could "
                                   "reuse another's prefix KV")
        return False
    return True
