"""The Python API (testbed/api.py, `from testbed import ...`): documented, typed views of a testbed, the code of
the command line behind each call, results as tables with points.csv's columns, and the CLI's guarantees on
signals: inside `with Testbed.up(...)` an exception or a signal removes the testbed, and the signal surfaces as
Python expects it (KeyboardInterrupt, SystemExit(128 + n)). The root tier brings real testbeds up."""

from __future__ import annotations

import ast
import json
import os
import pydoc
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REPO, netns_with_prefix

import testbed
from testbed import api
from testbed.check.checks import Check, VerifyReport
from testbed.plan import build_plan
from testbed.run.summary import RunSummary, ScheduleSummary, StageLink, StagePlacement
from testbed.topology import load_topology
from testbed.util import interrupts


def test_the_package_exports_the_api_lazily_and_documents_it() -> None:
    fresh = subprocess.run([sys.executable, "-c", "import sys, testbed; print('testbed.api' in sys.modules)"],
                           capture_output=True, text=True, cwd=REPO, check=True)
    assert fresh.stdout.strip() == "False"                # the CLI and workers do not load it
    from testbed import At, Testbed, link_down  # noqa: F401
    assert testbed.Testbed is api.Testbed and set(testbed.__all__) <= set(dir(testbed))
    for name in testbed.__all__:
        assert getattr(testbed, name) is getattr(api, name)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        testbed.Nope  # noqa: B018
    doc = pydoc.render_doc(testbed.Testbed, renderer=pydoc.plaintext)
    for needed in ("up(topology", "attach(name", "nodes", "links", "exec(self, node", "popen(self, node", "link(self, a",
                   "verify(self, level", "run(self, schedules", "experiment(self", "with` block"):
        assert needed in doc, needed
    public = [n for n in dir(api.Testbed) if not n.startswith("_")]
    assert all(getattr(api.Testbed, n).__doc__ for n in public), [n for n in public if not getattr(api.Testbed, n).__doc__]


def test_point_columns_are_the_experiments_csv_header() -> None:
    """One list: the API's columns are the experiment's, and sweep.py writes that list as points.csv's header."""
    from testbed.experiment import records

    assert api.POINT_COLUMNS is records.POINT_COLUMNS
    tree = ast.parse((REPO / "testbed" / "experiment" / "sweep.py").read_text())
    headers = [node.args[0].id for node in ast.walk(tree)
               if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "writerow"
               and node.args and isinstance(node.args[0], ast.Name)]
    assert headers == ["POINT_COLUMNS"]


def _measured(schedule: str, setting: str | None = None, step: float = 1.0) -> ScheduleSummary:
    return ScheduleSummary(schedule=schedule, bubble_ratio=0.2, bubble_ratio_per_stage=[0.2, 0.2], step_time_s=step,
                           step_time_spread_s=[step, step], tokens_per_s=1000.0, bubble_ratio_iterations=None,
                           exposed_comm_s=0.1, exposed_comm_s_per_stage=None, compute_s_per_stage=None,
                           peak_inflight_activation_bytes=4096, peak_inflight_activation_bytes_per_stage=None,
                           loss_first=None, loss_last=3.5, iterations=2, bubble_vs_reference=0.25,
                           span_stretch_per_stage=[1.0, 1.2], link_setting=setting)


def _summary(schedules: list[ScheduleSummary], options: dict[str, Any]) -> RunSummary:
    return RunSummary(run_id="r", topology="2dc-1000km", testbed="t", stages=[StagePlacement(0, "h0", "dc-a")],
                      stage_links=[StageLink(5e-3, 1e9)], links=[], lossless_ok=True, shaper="delayline",
                      backend="netns", switch=None, shaper_calibration_s={}, transport="gloo-tcp", kernel="k", cpus=2,
                      oversubscribed=False, workers=2, delay_daemons=2, options=options, schedules=schedules)


def test_a_runs_rows_have_the_points_columns(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"events": [{"kind": "link_down"}]}))
    summary = _summary([_measured("1f1b"), _measured("mine")],
                       {"microbatches": 8, "memory_budget": "1f1b+1", "unbudgeted": ["mine"]})
    result = api.RunResult.of(tmp_path, summary)
    assert isinstance(result, RunSummary) and result.events == [{"kind": "link_down"}] and result.run_dir == tmp_path
    rows = result.to_frame() if not _has_pandas() else result.rows()
    assert [list(r) for r in rows] == [api.POINT_COLUMNS] * 2
    first = rows[0]
    assert (first["sweep"], first["distance_km"], first["delay_ms"], first["rate_mbit"], first["schedule"]) == \
        ("run", pytest.approx(1000), pytest.approx(5), 1000, "1f1b")
    assert (first["memory_budget"], rows[1]["memory_budget"], first["bubble_vs_reference"], first["span_stretch_max"]) \
        == ("1f1b+1", None, 0.25, 1.2)


def test_a_swept_runs_rows_carry_each_points_setting(tmp_path: Path) -> None:
    plan = build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"), "t")
    tb = api.Testbed(SimpleNamespace(state=SimpleNamespace(plan=plan, name="t")), owned=False, log=None)
    grid = tb.link("dc-b", "dc-a").sweep(distances_km=[0, 2000], rates=["1gbit", 200e6])
    assert [(p.label, p.delay_s, p.rate_bps) for p in grid.points] == [
        ("0km-1000mbit", 0.0, 1e9), ("2000km-1000mbit", 0.01, 1e9), ("0km-200mbit", 0.0, 2e8),
        ("2000km-200mbit", 0.01, 2e8)]
    assert [p.delay_s for p in tb.link("dc-a", "dc-b").sweep(rates=["1gbit"]).points] == [0.005]   # as it is now
    from dataclasses import asdict
    summary = _summary([_measured("1f1b", "2000km-200mbit")], {"microbatches": 4, "sweep": asdict(grid)})
    (row,) = api.RunResult.of(tmp_path, summary).rows()
    assert (row["sweep"], row["distance_km"], row["rate_mbit"]) == ("run:2000km-200mbit", pytest.approx(2000), 200)


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


def test_an_experiments_table_is_its_points_csv(tmp_path: Path) -> None:
    (tmp_path / "points.csv").write_text(",".join(api.POINT_COLUMNS) + "\n"
                                         + "distance,1000,5,1000,8,geopipe,0,1f1b+1,10.1,0.3,0.2,,1.5,1.4,900,0.1,"
                                           "4096,1.1,0,0,3.2\n")
    rows = api.ExperimentResult(tmp_path).rows()
    assert list(rows[0]) == api.POINT_COLUMNS
    assert rows[0]["schedule"] == "geopipe" and rows[0]["distance_km"] == 1000 and rows[0]["bubble_model"] is None
    assert rows[0]["step_s"] == 1.5
    frame = api.ExperimentResult(tmp_path).to_frame()
    assert list(frame.columns if _has_pandas() else frame[0]) == api.POINT_COLUMNS


def test_the_quick_spec_is_one_distance_against_0km_with_two_schedules() -> None:
    spec = api.ExperimentSpec.quick(results="/tmp/r")
    assert isinstance(spec, testbed.ExperimentSpec) and spec.results == "/tmp/r"
    assert (spec.distances_km, spec.schedules, spec.focus_schedules, spec.repetitions, spec.budgets, spec.rates_mbit) \
        == ([0.0, 1000.0], ["1f1b", "geopipe"], [], 1, [], [])
    from testbed.experiment.records import ExperimentSpec
    from testbed.experiment.sweep import Experiment

    assert ExperimentSpec.from_json(json.loads(json.dumps(_asdict(spec)))) == ExperimentSpec(**_asdict(spec))
    planned = Experiment(spec, log=lambda _m: None).planned()
    assert [(s.km, s.schedule) for s in planned] == [(0, "1f1b"), (0, "geopipe"), (1000, "1f1b"), (1000, "geopipe")]


def _asdict(spec: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(spec)


class FakeBackend:
    """A running testbed's backend, scripted: its state and the commands it was asked to run."""

    name = "netns"

    def __init__(self, name: str = "t") -> None:
        self.state = SimpleNamespace(plan=build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"), name),
                                     name=name, shaper_name="delayline", topology_source="x.yaml")
        self.ran: list[Any] = []

    def exec(self, node: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.ran.append((node, argv, kwargs))
        return subprocess.CompletedProcess(argv, 0, "out", "")

    def popen(self, node: str, argv: list[str], **kwargs: Any) -> Any:
        self.ran.append((node, argv, kwargs))
        return SimpleNamespace(argv=argv)


def test_views_commands_and_link_changes_use_the_clis_code(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend()
    tb = api.Testbed(backend, owned=False, log=None)
    plan = backend.state.plan
    assert [n.name for n in tb.hosts] == [h.name for h in plan.hosts] and tb.node("dc-a-rtr").role == "router"
    assert tb.hosts[0].ip and "/" in tb.hosts[0].addresses[0]
    (link,) = tb.links
    assert (link.a, link.b, link.forward.label, link.backward.label) == ("dc-a", "dc-b", "dc-a -> dc-b", "dc-b -> dc-a")
    assert (link.forward.delay_s, link.forward.rate_bps, link.forward.measured_delay_s) == (0.005, 1e9, None)
    tb._remember([Check("one-way", "x", "", "", True, key="dc-a -> dc-b", value=0.0051),
                  Check("throughput", f"{link.name} dc-b -> dc-a", "", "", True, value=9.4e8)])
    assert (tb.links[0].forward.measured_delay_s, tb.links[0].backward.measured_rate_bps) == (0.0051, 9.4e8)

    tb.exec("dc-a-h1", "ip addr | head -1")
    tb.exec("dc-a-h1", ["true"], timeout=3)
    tb.popen("dc-b-h1", "sleep 1", stdout=subprocess.PIPE)
    assert backend.ran == [("dc-a-h1", ["sh", "-c", "ip addr | head -1"],
                            {"timeout": None, "check": False, "capture_output": True, "text": True}),
                           ("dc-a-h1", ["true"], {"timeout": 3, "check": False, "capture_output": True, "text": True}),
                           ("dc-b-h1", ["sh", "-c", "sleep 1"], {"stdout": subprocess.PIPE})]

    changed: list[Any] = []
    import testbed.deploy.linkset as linkset
    monkeypatch.setattr(linkset, "set_link", lambda b, a, z, **kw: changed.append((a, z, kw)))
    tb.link("dc-b", "dc-a").set(delay="10ms", rate="100mbit")
    tb.link("dc-a", "dc-b").set(distance_km=2000, from_dc="dc-a")
    assert changed == [("dc-b", "dc-a", {"from_dc": None, "delay_s": 0.01, "rate_bps": 1e8, "jitter_s": None,
                                         "loss": None, "edge_rate_bps": None}),
                       ("dc-a", "dc-b", {"from_dc": "dc-a", "delay_s": pytest.approx(0.01), "rate_bps": None,
                                         "jitter_s": None, "loss": None, "edge_rate_bps": None})]
    with pytest.raises(api.BackendError, match="no OTN link between 'dc-a' and 'dc-c' in t; links: dc-a<->dc-b"):
        tb.link("dc-a", "dc-c")
    with pytest.raises(api.BackendError, match="delay: .*parsecs"):
        tb.link("dc-a", "dc-b").set(delay="10parsecs")


def test_verify_remembers_what_it_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend()
    import testbed.check.verify as verify
    monkeypatch.setattr(verify, "verify_testbed", lambda b, level: VerifyReport("t", [
        Check("one-way", "l", "5 ms", "5.1 ms", True, key="dc-b -> dc-a", value=0.0051)]))
    tb = api.Testbed(backend, owned=False, log=None)
    assert tb.verify("quick").ok and tb.links[0].backward.measured_delay_s == 0.0051
    with pytest.raises(api.BackendError, match="verify level 'slow'"):
        tb.verify("slow")


@pytest.fixture
def owned(monkeypatch: pytest.MonkeyPatch) -> tuple[api.Testbed, list[str]]:
    """A testbed as Testbed.up leaves it (owned, holding the signal guard), with `down` scripted."""
    downs: list[str] = []
    monkeypatch.setattr(api.lifecycle, "down", lambda name: downs.append(name) or 0.1)
    monkeypatch.setattr(api.statefile, "exists", lambda name: name not in downs)
    tb = api.Testbed(FakeBackend("mine"), owned=True, log=None)
    api._GUARD.acquire()
    tb._guarding = True
    return tb, downs


def test_an_exception_in_the_block_removes_the_testbed_and_propagates(owned: tuple[api.Testbed, list[str]]) -> None:
    tb, downs = owned
    with pytest.raises(ZeroDivisionError), tb:
        1 / 0  # noqa: B018
    assert downs == ["mine"] and api._GUARD.depth == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL        # the handlers are the program's again


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, SystemExit),
                                                  (signal.SIGHUP, SystemExit)])
def test_a_signal_in_the_block_removes_the_testbed_then_surfaces_as_python_expects(
        owned: tuple[api.Testbed, list[str]], signum: int, expected: type[BaseException]) -> None:
    tb, downs = owned
    with pytest.raises(expected) as err, tb:
        os.kill(os.getpid(), signum)
        pytest.fail("the signal did not stop the block")
    assert downs == ["mine"] and api._GUARD.depth == 0 and interrupts._depth == 0
    if expected is SystemExit:
        assert err.value.code == 128 + signum
    assert isinstance(err.value.__cause__, interrupts.Interrupted)


def test_an_attached_testbed_is_left_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.lifecycle, "open_backend", lambda name: FakeBackend(name or "only"))
    monkeypatch.setattr(api.lifecycle, "down", lambda name: pytest.fail("an attached testbed was taken down"))
    with api.Testbed.attach("theirs") as tb:
        assert tb.name == "theirs" and not tb.owned
    with pytest.raises(ValueError), api.Testbed.attach() as tb:
        raise ValueError


def test_a_call_outside_a_testbed_turns_its_signal_into_keyboardinterrupt() -> None:
    # The program's own SIGINT handler comes back, whatever it was: Python's default_int_handler in a terminal,
    # SIG_IGN in a process a shell started in the background (`nohup make test &`), which the guard must keep.
    programs = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), api._guarded():
        assert signal.getsignal(signal.SIGINT) is not programs
        os.kill(os.getpid(), signal.SIGINT)
        pytest.fail("not interrupted")
    assert api._GUARD.depth == 0 and signal.getsignal(signal.SIGINT) is programs


def test_registering_schedules_and_the_events_helpers() -> None:
    @api.schedule()
    def my_sched(stages: int, microbatches: int) -> Any:
        from workloads.schedule import one_f_one_b
        return one_f_one_b(stages, microbatches)
    try:
        assert "my-sched" in api.registered_schedules()
        assert api._schedule_names([my_sched, "1f1b"]) == ["my-sched", "1f1b"]
        assert api._schedule_names("1f1b, geopipe") == ["1f1b", "geopipe"]
    finally:
        api.unregister_schedule("my-sched")
    assert api.link_down("dc-a", "dc-b", for_s="200ms") == api.LinkDown("dc-a", "dc-b", 0.2)
    assert api.link_set("dc-a", "dc-b", delay=0.01, rate="1gbit") == api.LinkChange("dc-a", "dc-b", 0.01, 1e9, None)
    assert api.km(1000) == pytest.approx(0.005)


# --- the root tier: real testbeds ---------------------------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import sys, time
    from testbed import Testbed
    with Testbed.up("2dc-1000km", name=sys.argv[1], verify="skip") as tb:
        print("up", tb.name, len(tb.hosts), flush=True)
        if sys.argv[2] == "raise":
            raise RuntimeError("the user's code failed")
        time.sleep(120)
""")


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["raise", "SIGINT", "SIGTERM"])
def test_nothing_is_left_after_an_exception_or_a_signal_inside_the_block(stop: str, unique_name: str, tmp_path: Path,
                                                                          terminal: Any) -> None:
    from terminal import _wait_for

    from testbed.state import store as state

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    term = terminal([sys.executable, str(script), unique_name, "raise" if stop == "raise" else "wait"])
    _wait_for(lambda: "up " in term.output() or "Error" in term.output(), "the block", term, timeout_s=120)
    if stop == "SIGINT":
        term.ctrl_c()
    elif stop == "SIGTERM":
        os.kill(term.pid, signal.SIGTERM)
    term.wait_exit()
    output = term.output()
    if stop != "SIGINT":
        assert term.status() == {"raise": 1, "SIGTERM": 143}[stop], output
    # An uncaught KeyboardInterrupt ends Python by SIGINT (status 130), and the shell that waited for it then stops
    # too (bash's cooperative exit on Ctrl-C), so no status is recorded: its own KeyboardInterrupt is the evidence.
    assert {"raise": "RuntimeError: the user's code failed", "SIGINT": "KeyboardInterrupt",
            "SIGTERM": "received SIGTERM; everything the testbed created was removed"}[stop] in output
    assert netns_with_prefix(f"tb-{unique_name}-") == []
    assert not (state.state_dir() / f"{unique_name}.json").exists()


@pytest.mark.root
@pytest.mark.slow
def test_the_quick_demo_is_the_same_report_in_under_90_s(tmp_path: Path) -> None:
    """`make demo QUICK=1`: one distance against 0 km, two schedules, the experiment's report and plots."""
    import time

    before = set(netns_with_prefix("tb-exp"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "testbed", "experiment", "--quick", "--results", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    print(f"\n$ make demo QUICK=1  ({seconds:.0f} s)\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    (exp_dir,) = tmp_path.iterdir()
    for made in ("report.md", "report.html", "points.csv", "summary.json", "bubble_vs_distance.png"):
        assert (exp_dir / made).exists(), made
    doc = json.loads((exp_dir / "summary.json").read_text())
    assert not doc["partial"] and {(p["distance_km"], p["schedule"]) for p in doc["points"]} == {
        (0.0, "1f1b"), (0.0, "geopipe"), (1000.0, "1f1b"), (1000.0, "geopipe")}
    assert seconds < 90, f"the quick demo took {seconds:.0f} s"
    assert set(netns_with_prefix("tb-exp")) <= before


def test_an_experiment_on_a_testbed_already_up_sweeps_it_and_puts_its_link_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.experiment.sweep import Experiment

    backend = FakeBackend()
    backend.state.topology_source = str(REPO / "topologies" / "2dc-1000km.yaml")
    calls: list[Any] = []
    monkeypatch.setattr(Experiment, "_verify", lambda self, b: calls.append(("verify", b is backend)))
    monkeypatch.setattr(Experiment, "_sweeps", lambda self, b: calls.append(("sweeps", self.spec.microbatches)))
    monkeypatch.setattr(Experiment, "_write", lambda self, b, stopped=None: calls.append(("write", stopped)))
    import testbed.run.runner as runner
    monkeypatch.setattr(runner, "set_link", lambda b, a, z, **kw: calls.append(("set", a, z, kw["from_dc"],
                                                                                  kw["delay_s"], kw["rate_bps"])))
    monkeypatch.setattr(api, "ExperimentResult", lambda exp_dir: exp_dir)
    tb = api.Testbed(backend, owned=False, log=None)
    exp_dir = tb.experiment(api.ExperimentSpec.quick(results=str(tmp_path)), microbatches=4)
    assert exp_dir.parent == tmp_path and (exp_dir / "topology.yaml").exists() and (exp_dir / "plan.json").exists()
    put_back = [("set", d.src_dc, d.dst_dc, d.src_dc, d.delay_s, d.rate_bps) for d in backend.state.plan.directions]
    assert calls == [("verify", True), ("sweeps", 4), ("write", None), *put_back]

    calls.clear()
    monkeypatch.setattr(Experiment, "_sweeps", lambda self, b: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        tb.experiment(api.ExperimentSpec.quick(results=str(tmp_path / "again")))
    assert calls == [("verify", True), ("write", "division by zero"), *put_back]
