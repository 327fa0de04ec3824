"""The TP collectives vradix runs, in one place: every rank of an engine's TP group calls each of them at the same
point of the same control request, so none can hang; on a single rank (no group, or a group of one) each returns this
rank's value without a collective. `torch.distributed` is imported only when a group of more than one rank exists."""
from __future__ import annotations


def tp_cpu_group(scheduler):
    """The scheduler's TP CPU (gloo) group, or None on a single rank."""
    return getattr(getattr(scheduler, "tp_group", None), "cpu_group", None)


def tp_rank_and_size() -> tuple:
    """This process's (rank, size) in its TP group; (0, 1) where no TP group exists."""
    try:
        from sglang.srt.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        return group.rank_in_group, group.world_size
    except Exception:  # noqa: BLE001 - no parallel context (a single process built without one)
        return 0, 1


def world_of(group) -> int:
    """The number of ranks in `group` (1 without one)."""
    if group is None:
        return 1
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_initialized() else 1


def gather(share, group) -> list:
    """Every rank's `share`, in rank order (one all_gather_object over `group`; just this rank's without one)."""
    world = world_of(group)
    if world == 1:
        return [share]
    import torch.distributed as dist

    shares = [None] * world
    dist.all_gather_object(shares, share, group=group)
    return shares


def on_any_rank(flag: bool, group) -> bool:
    """Whether `flag` holds on any rank of `group` (one all_reduce MAX; this rank's flag without one)."""
    if world_of(group) == 1:
        return flag
    import torch
    import torch.distributed as dist

    value = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())
