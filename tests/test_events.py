"""Events during a run (testbed/run/events.py) on a scripted backend and clock: when an event is armed (rank 0's
end of the iteration before it, in the workers' interleaved order), applied and undone; an outage holds the
link's packets (its HTB class slowed to one MTU per outage, then put back to the plan's rate) rather than touching
the delay line; a change goes through set_link and is put back; everything is undone when the run ends; and the
record lands in summary.json and trace.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from testbed.plan import build_plan
from testbed.run import events as E
from testbed.run.events import At, EventError, EventPlayer, LinkChange, LinkDown
from testbed.topology import load_topology

REPO = Path(__file__).resolve().parent.parent


def test_the_order_the_workers_run_and_what_arms_an_event() -> None:
    assert E.iteration_order(["a", "b"], 3) == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2),
                                                 ("a", 3), ("b", 3)]
    down = LinkDown("dc-a", "dc-b", 0.1)
    assert E.trigger_of(At(2, down), ["1f1b"], 3) == ("1f1b", 1)
    assert E.trigger_of(At(1, down), ["1f1b"], 3) == ("1f1b", 0)          # the warm-up's end
    assert E.trigger_of(At(2, down), ["a", "b"], 3) == ("b", 1)            # iteration 2 runs b first
    assert E.trigger_of(At(2, down, schedule="a"), ["a", "b"], 3) == ("b", 2)
    assert E.trigger_of(At(3, down, schedule="b"), ["a", "b"], 3) == ("a", 3)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    plan = build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"), "t")
    calls: list[tuple[Any, ...]] = []
    state = SimpleNamespace(plan=plan, shaper_name="delayline")

    class Netlink:
        def __init__(self, node: str) -> None:
            self.node = node

        def __enter__(self) -> Netlink:
            return self

        def __exit__(self, *_a: object) -> None:
            return None

    backend = SimpleNamespace(state=state, netlink=Netlink)
    monkeypatch.setattr(E.htb, "change_rate", lambda ipr, ifname, rate: calls.append(("rate", ipr.node, ifname, rate)))

    def set_link(b: Any, a: str, z: str, *, from_dc: str | None = None, delay_s: float | None = None,
                 rate_bps: float | None = None, edge_rate_bps: float | None = None) -> None:
        calls.append(("set", a, z, from_dc, delay_s, rate_bps))
    monkeypatch.setattr(E, "set_link", set_link)
    return SimpleNamespace(backend=backend, plan=plan, calls=calls, clock=Clock())


def _player(scripted: SimpleNamespace, events: list[At], schedules: list[str] | None = None,
            factor: float = 1.0) -> EventPlayer:
    return EventPlayer(scripted.backend, events, schedules or ["1f1b"], 3, factor, log=lambda _m: None,
                       clock=scripted.clock)


def test_an_outage_holds_both_directions_then_puts_the_plans_rate_back(scripted: SimpleNamespace) -> None:
    player = _player(scripted, [At(2, LinkDown("dc-a", "dc-b", 0.2), offset_s=0.1)])
    player.observe({"event": "iteration", "rank": 1, "schedule": "1f1b", "iteration": 1})    # not rank 0
    player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 0})    # not the one before
    assert player.wait_s() == float("inf")
    player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 1})
    assert player.wait_s() == pytest.approx(0.1)
    scripted.clock.now += 0.05
    player.tick()
    assert scripted.calls == []
    scripted.clock.now += 0.06
    player.tick()
    directions = scripted.plan.directions
    # one frame of the link's MTU per outage: 200 ms at MTU 9000 is (9000 + 14) x 8 / 0.2 = 360.56 kbit/s
    assert scripted.calls == [("rate", d.src_node, d.src_ifname, (d.mtu + 14) * 8 / 0.2) for d in directions]
    assert {d.mtu for d in directions} == {9000} and E.pause_rate_bps(9000, 0.2) == pytest.approx(360_560)
    assert E.pause_rate_bps(1500, 100.0) == E.PAUSE_RATE_BPS                # the floor: HTB's 32-bit ticks
    assert player.wait_s() == pytest.approx(0.2)
    scripted.calls.clear()
    scripted.clock.now += 0.2
    player.tick()
    assert scripted.calls == [("rate", d.src_node, d.src_ifname, d.rate_bps) for d in directions]
    (record,) = player.records
    assert record.applied_at == pytest.approx(100.11) and record.restored_at == pytest.approx(100.31)
    assert record.restored and player.in_force().endswith("(applied and undone)")
    row = record.to_json(origin=100.0)
    assert (row["kind"], row["link"], row["start_s"], row["end_s"]) == ("link_down", "dc-a <-> dc-b", 0.11, 0.31)


def test_a_dilated_run_waits_and_holds_k_times_longer(scripted: SimpleNamespace) -> None:
    player = _player(scripted, [At(1, LinkDown("dc-a", "dc-b", 0.2), offset_s=0.1)], factor=2.0)
    player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 0})
    assert player.wait_s() == pytest.approx(0.2)
    scripted.clock.now += 0.2
    player.tick()
    assert player.wait_s() == pytest.approx(0.4)
    row = player.records[0].to_json(origin=50.0, factor=2.0)        # trace time is undilated: t / k - origin
    assert row["start_s"] == pytest.approx(0.1)


def test_a_change_goes_through_set_link_and_is_put_back_when_the_run_ends(scripted: SimpleNamespace) -> None:
    player = _player(scripted, [At(1, LinkChange("dc-a", "dc-b", delay_s=0.02, rate_bps=None))], factor=2.0)
    player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 0})
    player.tick()
    assert scripted.calls == [("set", "dc-a", "dc-b", None, 0.04, None)]          # k times the delay
    assert player.wait_s() == float("inf")                                        # until the run ends
    player.close()
    put_back = [("set", d.src_dc, d.dst_dc, d.src_dc, d.delay_s, d.rate_bps) for d in scripted.plan.directions]
    assert scripted.calls[1:] == put_back
    assert player.records[0].restored and player.records[0].note == "restored when the run ended"


def test_events_the_run_never_reached_are_recorded_as_such(scripted: SimpleNamespace) -> None:
    player = _player(scripted, [At(3, LinkDown("dc-a", "dc-b", 0.2)), At(1, LinkDown("dc-a", "dc-b", 0.2), 5.0)])
    player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 0})
    player.close()
    assert [r.note for r in player.records] == ["not applied: the run ended before its iteration",
                                                "not applied: the run ended first"]
    assert scripted.calls == [] and not any(r.restored for r in player.records)


@pytest.mark.parametrize(("event", "error"), [
    (At(0, LinkDown("dc-a", "dc-b", 0.1)), "timed iterations are 1..3"),
    (At(4, LinkDown("dc-a", "dc-b", 0.1)), "timed iterations are 1..3"),
    (At(1, LinkDown("dc-a", "dc-x", 0.1)), "no OTN link between 'dc-a' and 'dc-x'; links: dc-a <-> dc-b"),
    (At(1, LinkDown("dc-a", "dc-b", 0.1), schedule="gpipe"), "'gpipe' is not one of the run's schedules"),
    (At(1, LinkDown("dc-a", "dc-b", 0.0)), "for_s must be > 0"),
    (At(1, LinkDown("dc-a", "dc-b", 60.0)), "reaches the run's hang timeout"),
    (At(1, LinkDown("dc-a", "dc-b", 0.1), offset_s=-1), "offset_s must be >= 0"),
    (At(1, LinkChange("dc-a", "dc-b")), "give a delay, a rate and/or an edge rate"),
    ("link down", r"an event is At\("),
])
def test_an_event_the_run_cannot_apply_is_refused_before_it(scripted: SimpleNamespace, event: Any, error: str) -> None:
    with pytest.raises(EventError, match=error):
        E.validate([event], scripted.backend, ["1f1b"], 3, hang_timeout_s=60.0)


def test_no_shaper_no_events(scripted: SimpleNamespace) -> None:
    scripted.backend.state.shaper_name = "none"
    with pytest.raises(EventError, match="without a shaper"):
        E.validate([At(1, LinkDown("dc-a", "dc-b", 0.1))], scripted.backend, ["1f1b"], 3, hang_timeout_s=60.0)


def test_an_error_that_ends_the_run_names_the_events_in_force(scripted: SimpleNamespace) -> None:
    player = _player(scripted, [At(1, LinkDown("dc-a", "dc-b", 0.5))])
    with pytest.raises(RuntimeError) as err, E.playing(player):
        player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 0})
        player.tick()
        raise RuntimeError("worker 1 exited with 1")
    assert str(err.value).startswith("worker 1 exited with 1\nevents applied during the run: iteration 1 + 0 ms: "
                                     "link dc-a <-> dc-b down for 500 ms (in force when the run stopped)")
    assert scripted.calls[-1][3] == scripted.plan.directions[-1].rate_bps         # put back on the way out


def test_the_record_lands_in_the_summary_and_the_trace(scripted: SimpleNamespace, tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "r"}))
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0}]}))
    player = _player(scripted, [At(1, LinkDown("dc-a", "dc-b", 0.2)), At(3, LinkDown("dc-a", "dc-b", 0.2))])
    player.observe({"event": "iteration", "rank": 0, "schedule": "1f1b", "iteration": 0})
    player.tick()
    scripted.clock.now += 0.25
    player.tick()
    player.close()
    rows = E.write_records(tmp_path, player.records, origin=99.0)
    assert json.loads((tmp_path / "summary.json").read_text())["events"] == rows
    assert [r["applied"] for r in rows] == [True, False] and rows[0]["start_s"] == 1.0
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    span = next(e for e in trace if e["ph"] == "X")
    instant = next(e for e in trace if e["ph"] == "i")
    assert span["pid"] == instant["pid"] == 1 and span["ts"] == 1e6 and span["dur"] == pytest.approx(0.25e6)
    assert span["name"] == "link dc-a <-> dc-b down for 200 ms" and instant["s"] == "g"
