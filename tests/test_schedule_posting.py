"""The order an executor posts a rank's actions in (workloads/schedule.py: posting_order), and that the executor,
its trace and the models all use it."""

from __future__ import annotations

from workloads import schedule as S
from workloads.schedule import Action


def acts(text: str) -> list[Action]:
    return [Action.parse(t) for t in text.split()]


def test_receives_after_an_own_send_move_before_it() -> None:
    rank = acts("RF0 F0 SF0 RB0 RF1 F1 SF1 B0 SB0 RF2 RB1 F2")
    assert S.posting_order(rank, True) == acts("RF0 F0 RB0 RF1 SF0 F1 SF1 B0 RF2 RB1 SB0 F2")
    assert S.posting_order(rank, False) == rank


def test_a_send_that_does_not_follow_its_compute_keeps_its_place() -> None:
    rank = acts("F0 F1 SF0 RB0 SF1 B0")
    assert S.posting_order(rank, True) == rank


def test_every_shipped_schedule_stays_valid_and_complete() -> None:
    for name in ("gpipe", "1f1b", "1f1b-prefetch"):
        for stages in (2, 4):
            built = S.build(name, stages, 8)
            posted = [S.posting_order(r, True) for r in built]
            S.validate(posted, 8)
            assert [sorted(map(str, r)) for r in posted] == [sorted(map(str, r)) for r in built]
            assert any(p != r for p, r in zip(posted, built, strict=True)) or name == "gpipe"


def test_the_model_replays_the_posting_order() -> None:
    """1f1b at 0 km on a 1 Gbit/s link, 2 ms F and 4 ms B: in the schedule's order each receive's notice leaves
    behind the 128 KiB message sent just before it (1.05 ms at 1 Gbit/s), so the step is longer than with the
    receives posted first; the model must tell the two apart."""
    from testbed.experiment.model import StageTimes, predict

    base = dict(forward_s=[0.002, 0.002], backward_s=[0.004, 0.004], activation_bytes=131072,
                stash_bytes=[1 << 20, 1 << 20])
    schedule_order, _ = predict("1f1b", StageTimes(**base, receives_first=False), 16, [0.0], [1e9])
    receives_first, _ = predict("1f1b", StageTimes(**base, receives_first=True), 16, [0.0], [1e9])
    assert receives_first.iteration_s < 0.97 * schedule_order.iteration_s


def test_an_unknown_sender_names_the_choices() -> None:
    import pytest

    from testbed.run.runner import RunError, RunOptions

    with pytest.raises(RunError, match="use thread or inline"):
        RunOptions(schedules=["1f1b"], sender="async")
    assert RunOptions(schedules=["1f1b"]).sender == "thread"


def test_the_model_keeps_the_schedules_order_where_our_executor_does_not_post() -> None:
    """RDMA (sender-driven, no sender thread) and PyTorch's own schedules: the posting order does not apply."""
    from testbed.experiment.model import StageTimes, predict

    base = dict(forward_s=[0.002, 0.002], backward_s=[0.004, 0.004], activation_bytes=131072,
                stash_bytes=[1 << 20, 1 << 20])
    for schedule, transport in (("1f1b", "rdma"), ("torch-1f1b", "tcp")):
        first, _ = predict(schedule, StageTimes(**base, receives_first=True), 16, [0.0], [1e9], transport=transport)
        kept, _ = predict(schedule, StageTimes(**base, receives_first=False), 16, [0.0], [1e9], transport=transport)
        assert first.iteration_s == kept.iteration_s
