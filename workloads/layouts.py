"""How each schedule's model chunks sit on the ranks: ours and PyTorch's one-stage schedules hold one chunk
per rank; PyTorch's interleaved and V-shaped schedules two. Runs with the same layout compute the same per
rank, so they share one reference (workloads/reference.py)."""

from __future__ import annotations

TORCH_SCHEDULES = {
    "torch-gpipe": ("ScheduleGPipe", "single"),
    "torch-1f1b": ("Schedule1F1B", "single"),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "torch-zbv": ("ScheduleZBVZeroBubble", "v"),
    "torch-dualpipev": ("ScheduleDualPipeV", "v"),
    "torch-interleaved-zb": ("ScheduleInterleavedZeroBubble", "loop"),
    "torch-looped-bfs": ("ScheduleLoopedBFS", "loop"),
}
"""PyTorch's own schedules: class in torch.distributed.pipelining, and how its stages sit on the ranks
(`single`: one per rank; `loop`: two per rank, r and r + p (interleaved); `v`: two per rank, r and 2p-1-r)."""


def stage_layout(schedule: str) -> str:
    """How a schedule's model chunks sit on the ranks: runs with the same layout compute the same per rank."""
    return TORCH_SCHEDULES[schedule][1] if schedule in TORCH_SCHEDULES else "single"


def virtual_stages(schedule: str, rank: int, world: int) -> list[int]:
    """The model chunks (of `len` x world for the multi-stage schedules) that `rank` runs, in order."""
    layout = stage_layout(schedule)
    if layout == "loop":
        return [rank, rank + world]
    if layout == "v":
        return [rank, 2 * world - 1 - rank]
    return [rank]


def chunks_per_rank(schedule: str) -> int:
    return 1 if stage_layout(schedule) == "single" else 2
