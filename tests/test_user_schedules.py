"""A user's own schedules: registered in the user's process (workloads/schedule.py), computed, validated,
dry-run for deadlock and held against the memory budget before a run starts (testbed/run/userschedules.py),
handed to the workers as text (never as code), and refused with the reason before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed.plan import build_plan
from testbed.run import runner
from testbed.run.runner import RunError, RunOptions
from testbed.run.transport import TransportChoice
from testbed.run.userschedules import UserScheduleError, check, peaks, prepare, user_names
from testbed.topology import load_topology
from workloads import schedule as S
from workloads.memory import MemoryBudget
from workloads.simulate import Costs, simulate

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _fresh_registry():
    before = S.registered()
    yield
    for name in S.registered():
        if name not in before:
            S.unregister(name)


def one_f_one_b_text(stages: int, microbatches: int) -> str:
    return S.to_text(S.one_f_one_b(stages, microbatches))


def test_a_function_registered_builds_like_a_built_in_in_every_shape_it_returns() -> None:
    as_actions = lambda p, m: S.one_f_one_b(p, m)  # noqa: E731
    as_tokens = lambda p, m: [[str(a) for a in rank] for rank in S.one_f_one_b(p, m)]  # noqa: E731
    as_lines = lambda p, m: one_f_one_b_text(p, m).splitlines()  # noqa: E731
    for name, fn in (("mine-a", as_actions), ("mine-b", as_tokens), ("mine-c", one_f_one_b_text), ("mine-d", as_lines)):
        S.register(name, fn)
        assert S.build(name, 3, 4) == S.build("1f1b", 3, 4)
    assert S.registered()[-4:] == ["mine-a", "mine-b", "mine-c", "mine-d"]
    assert user_names(["1f1b", "mine-b", "geopipe"]) == ["mine-b"]


@pytest.mark.parametrize(("name", "error"), [("1f1b", "built-in"), ("torch-1f1b", "built-in"),
                                             ("Has Space", "lowercase"), ("", "lowercase")])
def test_a_name_that_is_taken_or_unwritable_is_refused(name: str, error: str) -> None:
    with pytest.raises(S.ScheduleError, match=error):
        S.register(name, S.one_f_one_b)


def test_a_malformed_result_says_which_rank_and_action() -> None:
    S.register("short", lambda p, m: S.one_f_one_b(p, m)[:-1])
    with pytest.raises(S.ScheduleError, match="3 stages needs 3 action lists"):
        S.build("short", 3, 2)
    S.register("typo", lambda p, m: ["F0 SF0 RB0 B0", "RF0 F0 X0"])
    with pytest.raises(S.ScheduleError, match="rank 1 action 2: not an action: 'X0'"):
        S.build("typo", 2, 1)
    S.register("missing", lambda p, m: ["F0 SF0 RB0 B0", "RF0 F0 B0"])
    with pytest.raises(S.ScheduleError, match="rank 1: SB0 missing"):
        S.build("missing", 2, 1)


def test_a_worker_builds_the_text_the_runner_handed_over_without_the_function(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / "user-schedules.json"
    shipped.write_text(json.dumps({"theirs": {"stages": 2, "microbatches": 3, "text": one_f_one_b_text(2, 3)}}))
    monkeypatch.setenv(S.USER_SCHEDULES_ENV, str(shipped))
    assert "theirs" not in S.registered()
    assert S.build("theirs", 2, 3) == S.build("1f1b", 2, 3)
    with pytest.raises(S.ScheduleError, match="handed over for 2 stages and 3 micro-batches, not 2 and 4"):
        S.build("theirs", 2, 4)
    monkeypatch.delenv(S.USER_SCHEDULES_ENV)
    with pytest.raises(ValueError, match="unknown schedule 'theirs'"):
        S.build("theirs", 2, 3)


SEND_LATE = "F0 RB0 B0 SF0\nRF0 F0 B0 SB0"
"""Rank 0 sends its activation only after its backward, which waits for the gradient rank 1 cannot make."""


def test_a_deadlock_is_refused_with_the_blocked_ranks() -> None:
    with pytest.raises(UserScheduleError, match=r"'late' refused before it ran: .*deadlock: rank 0 at B0 .*rank 1 at F0"):
        check("late", S.from_text(SEND_LATE), 1, link_delay_s=[5e-3], link_rate_bps=[1e9])


def test_the_memory_walk_is_the_simulators_and_budgets_bound_it() -> None:
    stash, act = 1000, 100
    costs = Costs([0.01] * 3, [0.02] * 3, [1e-3] * 2, [1e8] * 2, activation_bytes=act, stash_bytes=stash)
    for name in ("gpipe", "1f1b", "1f1b-prefetch"):
        schedule = S.build(name, 3, 6)
        assert [p.bytes for p in peaks(schedule, [stash] * 3, act)] == simulate(schedule, costs).peak_inflight_bytes
    # 1F1B fits 1f1b+0; GPipe (every forward before any backward) does not, and the error says where and by how much
    budget = MemoryBudget.parse("1f1b+0")
    memory = lambda: ([stash] * 3, act)  # noqa: E731
    check("ok", S.build("1f1b", 3, 6), 6, link_delay_s=[0, 0], link_rate_bps=[1e9, 1e9], budget=budget, memory=memory)
    with pytest.raises(UserScheduleError, match=r"stage 0 would hold .* in flight after action \d+ \(F3\), over its "
                                                r"memory budget .*1f1b\+0"):
        check("gp", S.build("gpipe", 3, 6), 6, link_delay_s=[0, 0], link_rate_bps=[1e9, 1e9], budget=budget,
              memory=memory)


def test_prepare_hands_over_text_and_names_a_failing_function() -> None:
    S.register("mine", one_f_one_b_text)
    shipped = prepare(["mine"], 2, 4, link_delay_s=[1e-3], link_rate_bps=[1e9])
    assert shipped == {"mine": {"stages": 2, "microbatches": 4, "text": one_f_one_b_text(2, 4)}}

    def broken(stages: int, microbatches: int) -> list[str]:
        raise ZeroDivisionError("oops")
    S.register("broken", broken)
    with pytest.raises(UserScheduleError, match="'broken': its function failed for 2 stages and 4 micro-batches: "
                                                "ZeroDivisionError: oops"):
        prepare(["broken"], 2, 4, link_delay_s=[1e-3], link_rate_bps=[1e9])


def test_run_options_take_registered_names_only() -> None:
    with pytest.raises(RunError, match="unknown schedule 'mine'"):
        RunOptions(schedules=["mine"])
    S.register("mine", one_f_one_b_text)
    assert RunOptions(schedules=["1f1b", "mine"]).schedules == ["1f1b", "mine"]


def _scripted_backend(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    plan = build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"), "t")
    state = SimpleNamespace(plan=plan, processes=[], rdma=None, undilated=None, shaper_name="delayline")
    monkeypatch.setattr(runner, "restore_links", lambda _b: False)
    monkeypatch.setattr(runner, "choose_transport", lambda *_a: TransportChoice("tcp", "scripted"))
    monkeypatch.setattr(runner, "run_group", lambda *_a, **_k: pytest.fail("workers started"))
    monkeypatch.setattr(runner, "check_delays", lambda *_a, **_k: pytest.fail("links probed"))
    return SimpleNamespace(state=state, name="netns")


def test_a_run_with_a_deadlocking_schedule_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _scripted_backend(monkeypatch)
    S.register("late", lambda p, m: SEND_LATE)
    with pytest.raises(UserScheduleError, match="'late' refused before it ran: .*deadlock"):
        runner.run_schedules(backend, RunOptions(schedules=["1f1b", "late"], microbatches=1), tmp_path, run_id="r",
                             log=lambda _m: None)
    assert not (tmp_path / "r").exists()


def test_a_run_over_budget_is_refused_with_the_profiles_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a deployment's profile the stash and activation come from its table (16 layers of 544 MiB a stage):
    1F1B holds two micro-batches on stage 0 of 2, GPipe a third after its third forward."""
    backend = _scripted_backend(monkeypatch)
    S.register("gp", lambda p, m: S.gpipe(p, m))
    options = RunOptions(schedules=["gp"], microbatches=4, memory_budget="1f1b+0", compute="gpt-7b-h100")
    with pytest.raises(UserScheduleError, match=r"'gp' refused before it ran: stage 0 would hold 25.\d GiB in flight after "
                                       r"action 4 \(F2\), over its memory budget of 17.\d GiB .*stash of 8.\d+ GiB "
                                       r"and activations of 32 MiB"):
        runner.run_schedules(backend, options, tmp_path, run_id="r", log=lambda _m: None)
    assert not (tmp_path / "r").exists()
