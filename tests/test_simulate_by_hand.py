"""The simulator against pipelines worked by hand, in absolute seconds (sizing and the model tests compare
candidates and measurements relatively, so a simulator off by a constant factor would pass them).

Two stages, two micro-batches, 1F1B: stage 0 runs F0 F1 B0 B1, stage 1 runs F0 B0 F1 B1; F takes 1 s, B 2 s."""

from __future__ import annotations

import dataclasses

import pytest

from workloads import schedule as S
from workloads.simulate import Costs, simulate


def _costs(delay_s: float, transfer_s: float, receiver_driven: bool = False) -> Costs:
    # one byte per message at 1 / transfer_s bytes per second: each transfer takes transfer_s
    rate = 1.0 / transfer_s if transfer_s else 1e18
    return Costs([1.0, 1.0], [2.0, 2.0], [delay_s], [rate], activation_bytes=1, stash_bytes=0,
                 receiver_driven=receiver_driven)


def test_no_link_cost_the_step_is_m_plus_p_minus_one_slots() -> None:
    """Stage 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; stage 0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9]: step 9."""
    p = simulate(S.build("1f1b", 2, 2), _costs(0.0, 0.0))
    assert p.iteration_s == pytest.approx(9.0)
    assert p.compute_s == pytest.approx([6.0, 6.0])
    assert p.bubble_ratio == pytest.approx([1 / 3, 1 / 3])
    assert p.exposed_comm_s == pytest.approx([3.0, 1.0])      # stage 0 waits 2-4 and 6-7; stage 1 waits 0-1


def test_a_one_way_delay_is_paid_on_every_crossing_of_the_critical_path() -> None:
    """d = 0.5 s each way (sender-driven): stage 1 F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5]; stage 0
    B0 on the gradient at 5: [5,7], B1 on the one at 8: [8,10]: step 10."""
    assert simulate(S.build("1f1b", 2, 2), _costs(0.5, 0.0)).iteration_s == pytest.approx(10.0)


def test_a_transfer_time_is_paid_like_a_delay() -> None:
    """Each message occupies the link 0.25 s: stage 1 F0 [1.25,2.25] B0 [2.25,4.25] F1 [4.25,5.25] B1
    [5.25,7.25]; stage 0 B0 [4.5,6.5] B1 [7.5,9.5]: step 9.5."""
    assert simulate(S.build("1f1b", 2, 2), _costs(0.0, 0.25)).iteration_s == pytest.approx(9.5)


def test_gpipe_by_hand() -> None:
    """GPipe, the same costs, no link cost: stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,2] F1 [2,3] B0 [3,5]
    B1 [5,7]; stage 0 B0 [5,7] B1 [7,9]: step 9 again (the order differs, the critical path does not)."""
    assert simulate(S.build("gpipe", 2, 2), _costs(0.0, 0.0)).iteration_s == pytest.approx(9.0)


def test_a_send_lag_delays_each_message_and_not_the_compute() -> None:
    """Compute as time, sender-driven, every message posted 0.25 s after its compute ends (the executor's own
    time): like a 0.25 s delay on every crossing, stage 1 F0 [1.25,2.25] B0 [2.25,4.25] F1 [4.25,5.25] B1
    [5.25,7.25]; stage 0 B0 [4.5,6.5] B1 [7.5,9.5]: step 9.5; the compute is still 6 s per stage."""
    costs = _costs(0.0, 0.0)
    p = simulate(S.build("1f1b", 2, 2), dataclasses.replace(costs, send_lag_s=[0.25, 0.25]))
    assert p.iteration_s == pytest.approx(9.5) and p.compute_s == pytest.approx([6.0, 6.0])


def test_a_receive_post_and_its_notice_cost_their_lag_and_the_link_overhead() -> None:
    """gloo's receiver-driven sends, 1F1B, d = 0.5, a per-message overhead of 0.1 s on data and on notices, and
    each receive posted 0.2 s after the compute before it (a transfer: start + 0.6; a notice: post + 0.6).
    Stage 1 posts RF0 at 0.2, noticed at 0.8; F0 (sent at 1) arrives 1.6: F0 [1.6,2.6], B0 [2.6,4.6].
    Stage 0 runs F0 [0,1], F1 [1,2], posts RB0 at 2.2 (noticed 2.8); B0, sent at 4.6, arrives 5.2: B0 [5.2,7.2].
    Stage 1 posts RF1 at 4.8 (noticed 5.4); F1, sent at 2, arrives 6.0: F1 [6,7], B1 [7,9].
    Stage 0 posts RB1 at 7.4 (noticed 8.0); B1, sent at 9, arrives 9.6: B1 [9.6,11.6]. Step 11.6."""
    costs = Costs([1.0, 1.0], [2.0, 2.0], [0.5], [1e18], activation_bytes=1, stash_bytes=0, receiver_driven=True,
                  message_overhead_s=0.1, recv_lag_s=[0.2, 0.2])
    assert simulate(S.build("1f1b", 2, 2), costs).iteration_s == pytest.approx(11.6)


def test_a_stage_let_out_of_the_start_barrier_early_has_its_first_notice_there_in_time() -> None:
    """gloo, d = 2 (longer than F0): with every stage starting at 0, stage 1's notice for F0 reaches stage 0 at
    2, F0 (sent at 1) arrives 4: F0 [4,5] B0 [5,7], arriving 9; RF1 posted at 7, noticed 9, F1 arrives 11:
    F1 [11,12] B1 [12,14], arriving 16 (RB1 noticed at 13): stage 0's B1 [16,18], step 18. Stage 1 let out 2
    earlier (as the run's start barrier across the link does): the notice is there at 0, F0 arrives 3 and every
    later exchange a second sooner: step 17; the 2 s stage 1 waited before stage 0 began are not the step's."""
    costs = _costs(2.0, 0.0, receiver_driven=True)
    assert simulate(S.build("1f1b", 2, 2), costs).iteration_s == pytest.approx(18.0)
    early = simulate(S.build("1f1b", 2, 2), dataclasses.replace(costs, start_s=[0.0, -2.0]))
    assert early.iteration_s == pytest.approx(17.0)
    assert early.end_s == pytest.approx([17.0, 13.0]) and early.exposed_comm_s == pytest.approx([11.0, 7.0])
