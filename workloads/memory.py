"""In-flight memory of a pipeline stage: what it holds for micro-batches whose backward has not run yet.

One definition everywhere (the executor measures it, the sizer predicts it, the budget bounds it):
  stash        per pending micro-batch: the tensors autograd saved for its backward, parameters excluded,
               plus the stage's input and output it keeps for that backward (each storage counted once);
  receives     every posted receive buffer not yet consumed: activations (RF) and gradients (RB).
Gradient send buffers are not in it (each is freed when its send completes, within one link crossing).

A budget (`--memory-budget`) is either bytes per stage (`64MiB`) or relative to 1F1B (`1f1b+N`: what 1F1B
order with early receives holds on that stage, plus N more micro-batches in flight).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from workloads.errors import TestbedError


def pipeline_warmup(stage: int, stages: int) -> int:
    """1F1B's warm-up forwards on `stage` (p-1-s): it holds one more micro-batch than that at its peak."""
    return stages - 1 - stage


def activation_lookahead(stage: int, stages: int, microbatches: int, extra_before: int) -> int:
    """Activation receives `stage` posts ahead: all that the stage before it (holding `extra_before` extra
    micro-batches) can send before it needs a gradient back, so no send waits for a late post."""
    return min(microbatches, pipeline_warmup(stage, stages) + extra_before + 2) if stage > 0 else 0


def footprint_bytes(stage: int, stages: int, microbatches: int, *, extra: int, lookahead: int, stash_bytes: int,
                    activation_bytes: int) -> int:
    """Peak in-flight bytes of a 1F1B-ordered stage with `extra` more micro-batches in flight and `lookahead`
    activation receives posted ahead, every gradient receive posted right after its forward (geopipe and
    1f1b-prefetch). The peak is right after the forward that starts the steady state: `pending` forwards
    done, each with its stash and gradient receive, and the look-ahead refilled as far as micro-batches remain."""
    pending = min(pipeline_warmup(stage, stages) + extra + 1, microbatches)
    grad_buffers = pending if stage < stages - 1 else 0
    act_buffers = min(lookahead, microbatches - pending) if stage > 0 else 0
    return pending * stash_bytes + (grad_buffers + act_buffers) * activation_bytes


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Bytes of in-flight memory a stage may hold: a fixed figure, or 1F1B's plus `extra_microbatches`."""

    bytes: int | None = None
    extra_microbatches: int | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.extra_microbatches is None):
            raise ValueError("a memory budget is either bytes or 1f1b+N")
        if (self.bytes is not None and self.bytes <= 0) or (self.extra_microbatches or 0) < 0:
            raise ValueError("a memory budget must be positive (bytes) or 1f1b+N with N >= 0")

    @classmethod
    def parse(cls, text: str | int, parse_bytes: Callable[[str], int] = int) -> MemoryBudget:
        """`1f1b+2`, or bytes as `parse_bytes` reads them (plain integers here; the CLI passes its unit parser
        for `64MiB`)."""
        if isinstance(text, int):
            return cls(bytes=text)
        m = re.fullmatch(r"\s*1f1b\s*\+\s*(\d+)\s*", text, re.IGNORECASE)
        if m:
            return cls(extra_microbatches=int(m.group(1)))
        if re.fullmatch(r"\s*1f1b\s*", text, re.IGNORECASE):
            return cls(extra_microbatches=0)
        try:
            return cls(bytes=parse_bytes(text))
        except (ValueError, TypeError):
            raise ValueError(f"memory budget {text!r}: write bytes (e.g. 64MiB) or 1f1b+N (e.g. 1f1b+2)") from None

    @property
    def text(self) -> str:
        return f"1f1b+{self.extra_microbatches}" if self.extra_microbatches is not None else str(self.bytes)

    def per_stage(self, stages: int, microbatches: int, stash_bytes: list[int], activation_bytes: int) -> list[int]:
        """The budget in bytes on each stage, once the stash sizes are measured."""
        if self.bytes is not None:
            return [self.bytes] * stages
        n = self.extra_microbatches or 0
        return [footprint_bytes(s, stages, microbatches, extra=n, lookahead=activation_lookahead(s, stages, microbatches, n),
                                stash_bytes=stash_bytes[s], activation_bytes=activation_bytes) for s in range(stages)]


class BudgetExceeded(TestbedError, RuntimeError):
    """A stage held more in-flight memory than its budget allows."""
