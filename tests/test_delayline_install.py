"""The one delay-line installer (testbed/shaping/delayline_install.py) on a scripted place, without root: its
configuration generations, its daemon's start (recorded before it is ready; a daemon that exits or never gets
ready named with its log), its rules as the single machine and a remote machine select their packets, its
counters; and the shaper capabilities every caller asks for instead of a shaper's class."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from testbed.check import links
from testbed.remote.hostshape import HostShape, PeerDirection, ingress_rules
from testbed.run import runner
from testbed.shaping import delayline_install, registry
from testbed.shaping.base import Health, Shaper, ShaperError
from testbed.shaping.delayline import DaemonStats, QueueConfig, QueueStats, Timing
from testbed.shaping.delayline_install import DelayLineInstall, IptablesRule, delivered_rule, nfqueue_rule
from testbed.shaping.delayline_shaper import hold_rule
from testbed.shaping.netem_shaper import NetemShaper
from testbed.state.records import DaemonFiles, ShaperRecord

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ScriptedPlace:
    """A place whose commands are answered from a script: `refuse` names iptables arguments it refuses; `daemon`
    is the Python code its 'supervisor' runs instead (argv[-3:] are its config, stats and status files)."""

    name: str = "dc-b-rtr"
    daemon: str = ""
    refuse: tuple[str, ...] = ()
    ran: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.ran.append(list(argv))
        refused = any(word in argv for word in self.refuse)
        return subprocess.CompletedProcess(list(argv), 1 if refused else 0, "", "No chain/target/match by that name."
                                           if refused else "")

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        assert list(argv[1:3]) == ["-m", "testbed.shaping.supervisor"] and kwargs["start_new_session"]
        return subprocess.Popen([sys.executable, "-c", self.daemon, *argv[-3:]], **kwargs)

    def read_proc(self, path: str) -> str:
        return ""


def files(tmp_path: Path) -> DaemonFiles:
    return DaemonFiles(config=str(tmp_path / "d.json"), stats=str(tmp_path / "d.stats.json"),
                       log=str(tmp_path / "d.log"), status=str(tmp_path / "d.status.json"))


QUEUE = QueueConfig(queue=1, ifname="otn1", delay_s=4e-3, rate_bps=50e6, mtu=1500)


def test_each_configuration_is_a_new_generation_that_keeps_its_timing(tmp_path: Path) -> None:
    line = DelayLineInstall(ScriptedPlace(), files(tmp_path))
    assert line.configure([QUEUE], Timing(realtime=False, spin=True)) == 0
    assert line.configure([QUEUE, QUEUE]) == 1
    config = line.config()
    assert (config.generation, config.timing, len(config.queues)) == (1, Timing(realtime=False, spin=True), 2)
    assert config.queues[0] == QUEUE and not Path(files(tmp_path).config).with_suffix(".tmp").exists()


def test_start_records_the_daemon_before_it_is_ready_and_returns_when_it_is(tmp_path: Path) -> None:
    ready = "import sys, pathlib; pathlib.Path(sys.argv[2]).write_text('{}'); import time; time.sleep(30)"
    line = DelayLineInstall(ScriptedPlace(daemon=ready), files(tmp_path))
    line.configure([QUEUE])
    Path(line.files.stats).write_text("stale")
    pids: list[int] = []
    line.start(pids.append)
    try:
        assert len(pids) == 1 and Path(line.files.stats).read_text() == "{}"
    finally:
        subprocess.run(["kill", str(pids[0])], check=False)


def test_a_daemon_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    line = DelayLineInstall(ScriptedPlace(daemon="import sys; print('no NFQUEUE here'); sys.exit(3)"), files(tmp_path))
    line.configure([QUEUE])
    pids: list[int] = []
    with pytest.raises(ShaperError, match=r"delay daemon on dc-b-rtr exited with 3: no NFQUEUE here.*d\.log"):
        line.start(pids.append)
    assert len(pids) == 1


def test_a_daemon_that_never_gets_ready_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delayline_install, "READY_TIMEOUT_S", 0.3)
    line = DelayLineInstall(ScriptedPlace(daemon="import time; time.sleep(30)"), files(tmp_path))
    line.configure([QUEUE])
    pids: list[int] = []
    try:
        with pytest.raises(ShaperError, match="did not become ready in 0 s"):
            line.start(pids.append)
    finally:
        subprocess.run(["kill", str(pids[0])], check=False)


def test_rules_select_one_link_on_a_router_and_one_source_on_a_machine(tmp_path: Path) -> None:
    assert hold_rule("otn3").args("-A") == ["-t", "raw", "-A", "PREROUTING", "-i", "otn3", "-j", "NFQUEUE",
                                            "--queue-num", "3"]
    assert hold_rule("otn3").spec == "-A PREROUTING -i otn3 -j NFQUEUE --queue-num 3"
    assert delivered_rule("otn3").args("-D")[:4] == ["-t", "mangle", "-D", "PREROUTING"]
    shape = HostShape("tb", "dc-b-h1", "data0", egress=(), ingress=(
        PeerDirection("dc-a", ("10.9.0.1",), 4e-3, 50e6, 100), PeerDirection("dc-c", ("10.9.0.3", "10.9.0.4"), 3e-3,
                                                                          50e6, 100)))
    assert ingress_rules(shape) == [
        nfqueue_rule(1, "-i", "data0", "-s", "10.9.0.1/32", "-m", "comment", "--comment", "tb-remote:tb"),
        nfqueue_rule(2, "-i", "data0", "-s", "10.9.0.3/32", "-m", "comment", "--comment", "tb-remote:tb"),
        nfqueue_rule(2, "-i", "data0", "-s", "10.9.0.4/32", "-m", "comment", "--comment", "tb-remote:tb")]
    place = ScriptedPlace(refuse=("-D",))
    line = DelayLineInstall(place, files(tmp_path))
    line.add(hold_rule("otn3"))
    assert place.ran[-1][1:] == ["-w", *hold_rule("otn3").args("-A")]
    assert line.delete(hold_rule("otn3"), check=False) is False
    with pytest.raises(ShaperError, match="iptables on dc-b-rtr refused -t raw -D PREROUTING"):
        line.delete(hold_rule("otn3"))
    rule = ingress_rules(shape)[0]
    assert IptablesRule.from_json(json.loads(json.dumps({"table": rule.table, "chain": rule.chain,
                                                         "match": list(rule.match)}))) == rule


def test_hold_counters_read_from_the_daemons_statistics(tmp_path: Path) -> None:
    line = DelayLineInstall(ScriptedPlace(), files(tmp_path))
    assert line.stats() is None and line.holds(1) is None and line.supervisor() is None
    stats = DaemonStats(pid=1, ready=True, uptime_s=1.0, advance_us=80.0, spin=False, oversleep_p90_us=100.0,
                        generation=2, cpu_s=0.5, queues={1: QueueStats(released=40, error_us_sum=120.0)})
    Path(line.files.stats).write_text(json.dumps(stats.to_json()))
    assert line.holds(1) == (40, pytest.approx(120e-6)) and line.holds(2) is None


# -- capabilities instead of classes --------------------------------------------------------------------------


class Plain(Shaper):
    """A shaper with only what every shaper must have."""

    name = "plain"

    def apply(self, plan: Any) -> None:
        pass

    def set_direction(self, direction: Any) -> None:
        pass

    def health(self) -> Health:
        return Health()

    def drops(self) -> list[Any]:
        return []


def test_a_shaper_without_capabilities_answers_neutrally_wherever_it_is_asked() -> None:
    backend = SimpleNamespace(state=SimpleNamespace(shaper=ShaperRecord(name="netem", calibration_s={"a": 1e-4})))
    plain = Plain(backend)
    assert (plain.hold_counters(), plain.restarts(), plain.daemon_stats("r"), plain.calibration()) == ({}, {}, None, {})
    assert Plain.egress_leaf(4e-3, 100, 300) == (100, None) and not Plain.delays_ingress
    assert NetemShaper.egress_leaf(4e-3, 100, 300, jitter_s=1e-4) == (400, {"delay": 4000, "jitter": 100})
    assert NetemShaper(backend).calibration() == {"a": 1e-4}
    assert runner._hold_counters(plain) == {} and runner._restarts(plain) == 0
    assert runner._hold_counters(None) == {} and runner._restarts(None) == 0
    assert links.daemon_cpu(plain, "r") is None and links.daemons_cpu(None, ("r",)) is None
    total = links.daemons_cpu(plain, ("r", "s"))
    assert total is not None and total() is None


def test_a_remote_machine_gets_its_shaper_from_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "kernel_shaper", lambda: "netem")
    assert registry.machine_shaper("auto") is NetemShaper
    assert registry.machine_shaper("delayline").delays_ingress
    monkeypatch.setattr(registry, "kernel_shaper", lambda: "none")
    with pytest.raises(ShaperError, match="can emulate no delay"):
        registry.machine_shaper("auto")
    with pytest.raises(ShaperError, match="unknown shaper 'tbf'; choose auto or one of: delayline, netem"):
        registry.machine_shaper("tbf")


def test_no_caller_outside_shaping_names_a_shaper_class() -> None:
    """Callers ask a shaper for a capability; none imports a concrete shaper class or tests one with isinstance."""
    classes = {cls.__name__ for cls in registry.SHAPERS.values()}
    found = []
    for path in sorted((REPO / "testbed").rglob("*.py")):
        if path.parent.name == "shaping":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ({a.name for a in node.names} if isinstance(node, ast.ImportFrom)
                     else {node.id} if isinstance(node, ast.Name) else set())
            found += [f"{path.relative_to(REPO)}:{node.lineno} {name}" for name in names & classes]
    assert not found, f"a shaper's class named outside testbed/shaping/: {found}"
