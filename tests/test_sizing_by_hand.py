"""GeoPipe's plan on cases worked out by hand (beside the golden files, which record what the code produced):
2 stages over one 1000 km link (5 ms one way, 1 Gbit/s, 128 KiB activations)."""

from __future__ import annotations

import pytest

from workloads.memory import footprint_bytes
from workloads.sizing import size_geopipe

MIB = 1 << 20
ACT = 131072
TRANSFER = ACT * 8 / 1e9                     # 1.048576 ms at 1 Gbit/s
COVER = 2 * (0.005 + TRANSFER)               # a micro-batch's activation out and its gradient back: 12.097 ms


def _plan(compute_s: float, budget: list[int] | None = None):  # noqa: ANN202 - GeoPipeSizing
    return size_geopipe(2, 32, link_delay_s=[0.005], link_bytes_per_s=[1e9 / 8], activation_bytes=ACT,
                        forward_s=[compute_s / 3] * 2, backward_s=[2 * compute_s / 3] * 2, stash_bytes=[MIB] * 2,
                        budget_bytes=budget)


def test_cover_is_the_links_round_trip() -> None:
    assert _plan(0.013).cover_s == pytest.approx((COVER, 0.0))


@pytest.mark.parametrize(("compute_ms", "extra"), [(13.0, 1), (10.0, 2), (6.5, 2), (5.0, 3)])
def test_extra_micro_batches_cover_the_round_trip(compute_ms: float, extra: int) -> None:
    """Stage 0 keeps computing while its micro-batch's data is on the link: it needs ceil(12.097 ms / F+B)
    more micro-batches in flight than 1F1B: 13 ms -> 1, 10 ms -> 2, 6.5 ms -> 2 (13 ms), 5 ms -> 3 (15 ms)."""
    plan = _plan(compute_ms / 1e3)
    assert plan.extra_inflight == (extra, 0) and plan.bound == ("hidden", "no link")
    assert extra * compute_ms / 1e3 >= COVER > (extra - 1) * compute_ms / 1e3


def test_budget_holds_the_plan_and_says_so() -> None:
    """Stage 0 under 1F1B holds 2 micro-batches (its own and the one it has sent on), each 1 MiB of stash and a
    128 KiB gradient receive: 2 x 1.125 MiB = 2.25 MiB; each extra one adds 1.125 MiB. A budget of 3 MiB + 256
    KiB fits no extra (3.375 MiB would not): the plan wants 2 and holds 0, bound by the memory budget."""
    assert footprint_bytes(0, 2, 32, extra=0, lookahead=0, stash_bytes=MIB, activation_bytes=ACT) == 2 * (MIB + ACT)
    plan = _plan(0.010, budget=[3 * MIB + 2 * ACT, 10**9])
    assert plan.wanted_extra == (2, 0) and plan.extra_inflight == (0, 0)
    assert plan.bound == ("memory budget", "no link") and plan.footprint_bytes[0] == 2 * (MIB + ACT)
    roomy = _plan(0.010, budget=[4 * (MIB + ACT), 10**9])
    assert roomy.extra_inflight == (2, 0) and roomy.footprint_bytes[0] == 4 * (MIB + ACT)
