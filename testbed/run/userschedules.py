"""A user's own schedules (`workloads.schedule.register`, `testbed.register_schedule`) made ready for a run.

The function lives in the user's process, so its action lists are computed here, for the run's stages and
micro-batches, and checked before any worker starts: validated (every F and B once, receives before use, sends
matched), dry-run for deadlock by the discrete-event model (workloads/simulate.py, receiver-driven as gloo's TCP
is: the stricter of the two transports), and held against the run's memory budget action by action (the
executor's own accounting: workloads/memory.py). A schedule that fails any of these is refused with the reason.
The workers get the checked action lists as text (`RF3 F3 SF3 ...`, one line per rank) in a file named by
`workloads.schedule.USER_SCHEDULES_ENV`: no user code is imported by a worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.errors import TestbedError
from testbed.util.units import format_size
from workloads import schedule as S
from workloads.memory import MemoryBudget
from workloads.simulate import Costs, Deadlock, simulate


class UserScheduleError(TestbedError, ValueError):
    """A user schedule was refused before it ran; the message says which check and where."""


@dataclass(frozen=True, slots=True)
class MemoryPeak:
    """Where a stage's in-flight memory peaks under a schedule (the executor's accounting)."""

    stage: int
    bytes: int
    position: int
    action: str


def user_names(schedules: list[str]) -> list[str]:
    """The run's schedules that are user schedules registered in this process."""
    registered = set(S.registered())
    return [s for s in schedules if s in registered]


def _walk(acts: list[S.Action], stage: int, stages: int, stash_bytes: int, activation_bytes: int) -> list[int]:
    """In-flight bytes after each action of one stage: +1 activation per posted receive (RF, RB), F consumes its
    received activation and keeps its stash, B frees its stash and its gradient buffer (workloads/executor.py)."""
    held, out = 0, []
    for a in acts:
        if a.op in (S.Op.RECV_F, S.Op.RECV_B):
            held += activation_bytes
        elif a.op is S.Op.FORWARD:
            held += stash_bytes - (activation_bytes if stage > 0 else 0)
        elif a.op is S.Op.BACKWARD:
            held -= stash_bytes + (activation_bytes if stage < stages - 1 else 0)
        out.append(held)
    return out


def peaks(schedule: S.Schedule, stash_bytes: list[int], activation_bytes: int) -> list[MemoryPeak]:
    """Per stage, its in-flight peak and the first action that reaches it."""
    out = []
    for s, acts in enumerate(schedule):
        held = _walk(acts, s, len(schedule), stash_bytes[s], activation_bytes)
        top = max(held, default=0)
        pos = held.index(top) if held else -1
        out.append(MemoryPeak(s, top, pos, str(acts[pos]) if held else ""))
    return out


def first_over(schedule: S.Schedule, stash_bytes: list[int], activation_bytes: int,
               limits: list[int]) -> MemoryPeak | None:
    """The first action (stage by stage) after which a stage holds more than its limit: where the executor would
    stop the run; None if the schedule stays within every limit."""
    for s, acts in enumerate(schedule):
        for pos, held in enumerate(_walk(acts, s, len(schedule), stash_bytes[s], activation_bytes)):
            if held > limits[s]:
                return MemoryPeak(s, held, pos, str(acts[pos]))
    return None


def check(name: str, schedule: S.Schedule, microbatches: int, *, link_delay_s: list[float],
          link_rate_bps: list[float], budget: MemoryBudget | None = None,
          memory: Callable[[], tuple[list[int], int]] | None = None) -> None:
    """Refuse (UserScheduleError) a schedule that is malformed, deadlocks, or breaks `budget`; `memory` gives
    (stash bytes per stage, activation bytes) when a budget is to be checked."""
    stages = len(schedule)
    try:
        S.validate(schedule, microbatches)
    except S.ScheduleError as exc:
        raise UserScheduleError(f"schedule {name!r} refused before it ran: {exc}") from None
    costs = Costs(forward_s=[1.0] * stages, backward_s=[2.0] * stages, link_delay_s=list(link_delay_s),
                  link_bytes_per_s=[max(r, 1.0) / 8 for r in link_rate_bps], activation_bytes=1, stash_bytes=1)
    try:
        simulate(schedule, costs)
    except Deadlock as exc:
        raise UserScheduleError(f"schedule {name!r} refused before it ran: the dry run (workloads/simulate.py) "
                                f"stops in a {exc}") from None
    if budget is None or memory is None:
        return
    stash, act = memory()
    limits = budget.per_stage(stages, microbatches, stash, act)
    peak = first_over(schedule, stash, act, limits)
    if peak is not None:
        limit = limits[peak.stage]
        raise UserScheduleError(
            f"schedule {name!r} refused before it ran: stage {peak.stage} would hold {format_size(peak.bytes)} in "
            f"flight after action {peak.position} ({peak.action}), over its memory budget of {format_size(limit)} "
            f"(--memory-budget {budget.text}; per micro-batch a stash of {format_size(stash[peak.stage])} and "
            f"activations of {format_size(act)})")


def prepare(names: list[str], stages: int, microbatches: int, *, link_delay_s: list[float],
            link_rate_bps: list[float], budget: MemoryBudget | None = None, unbudgeted: list[str] | None = None,
            memory: Callable[[], tuple[list[int], int]] | None = None) -> dict[str, dict[str, Any]]:
    """Every named user schedule computed for this run and checked (`check`); what the workers read:
    name -> {stages, microbatches, text}."""
    shipped: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            schedule = S.user_schedule(name, stages, microbatches)
        except S.ScheduleError as exc:
            raise UserScheduleError(f"schedule {name!r} refused before it ran: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's function failed: say so, with its own words
            raise UserScheduleError(f"schedule {name!r}: its function failed for {stages} stages and {microbatches} "
                                    f"micro-batches: {type(exc).__name__}: {exc}") from exc
        check(name, schedule, microbatches, link_delay_s=link_delay_s, link_rate_bps=link_rate_bps,
              budget=None if name in (unbudgeted or []) else budget, memory=memory)
        shipped[name] = {"stages": stages, "microbatches": microbatches, "text": S.to_text(schedule)}
    return shipped


def measured_memory(model: Any, stages: int, split: list[int] | None, microbatch_size: int,
                    microbatches: int, seed: int) -> tuple[list[int], int]:
    """(stash bytes per stage, activation bytes) of one micro-batch, measured as the workers measure them: each
    stage's forward under the executor's saved-tensor accounting (workloads/stagecompute.py), on this CPU."""
    import torch

    from workloads.data import batches
    from workloads.model import build_stages, loss_fn
    from workloads.stagecompute import Arithmetic

    torch.set_num_threads(1)
    shape = (microbatch_size, model.block_size, model.n_embd)
    x, y = batches(microbatch_size, model.block_size, seed).next()
    stash, act = [], 0
    for rank, stage in enumerate(build_stages(model, stages, split)):
        compute = Arithmetic(stage, rank, stages, shape, microbatches, loss_fn)
        act = compute.activation_bytes
        inp = x if rank == 0 else torch.randn(shape).requires_grad_()
        kept, _, _ = compute.forward(0, inp, [x] if rank == 0 else None, [y] if rank == stages - 1 else None, None)
        stash.append(int(kept.bytes))
    return stash, act
