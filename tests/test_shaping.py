"""Root tier: the delay line and HTB on real namespaces, asserted by measurement and kernel read-back.

Each assertion has a tolerance that fails when shaping is off or wrong: a missing delay hold measures
~0.1 ms instead of milliseconds, a missing rate limit measures several Gbit/s, a killed daemon loses packets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BACKEND_PARAMS, REPO, run_cli

from testbed.check.links import DISTURBED_RUNS, THROUGHPUT_RUNS, check_delays, check_drops, check_throughput
from testbed.deploy import lifecycle
from testbed.shaping.htb import change_rate, read_class_rate
from testbed.shaping.registry import shaper_for

pytestmark = pytest.mark.root

TOPO = str(REPO / "tests" / "fixtures" / "topologies" / "2dc-shaping.yaml")


@pytest.fixture(params=BACKEND_PARAMS)
def shaped(unique_name: str, request: pytest.FixtureRequest):
    """The same shaping checks on each backend: the shapers only see namespaces, never the backend."""
    run_cli("up", TOPO, "--name", unique_name, "--shaper", "delayline", "--verify", "skip", "--backend", request.param)
    try:
        yield lifecycle.open_backend(unique_name)
    finally:
        run_cli("down", unique_name)


def _by_subject(checks):
    return {c.subject: c for c in checks}


def _delay_ms(check) -> float:
    value, unit = check.measured.split(" median")[0].split()
    return float(value) * (1.0 if unit == "ms" else 1e-3)


def _delays_within(backend, wanted_ms: dict[str, tuple[float, float]], probes: int = 10) -> dict:
    """Measure up to three rounds, a second apart, until every median is within its bound. A host stall on 2
    shared cores can shift a whole round of probes by a millisecond or two, and one noisy episode has spanned
    two back-to-back rounds (CI, 2026-12-03: 5.68 ms for 4 ms); a wrong or missing delay hold misses every round."""
    for attempt in range(3):
        if attempt:
            time.sleep(1.0)
        delays = _by_subject(check_delays(backend, probes=probes))
        if all(abs(_delay_ms(delays[s]) - ms) < tol for s, (ms, tol) in wanted_ms.items()):
            break
    return delays


def test_delay_rate_and_zero_loss_per_direction(shaped) -> None:
    rtt_subject = "dc-a--dc-b from dc-a"
    delays = _delays_within(shaped, {"dc-a--dc-b dc-a -> dc-b": (4.0, 0.15), "dc-a--dc-b dc-b -> dc-a": (2.0, 0.1),
                                     rtt_subject: (6.0, 0.25)})
    ab, ba = delays["dc-a--dc-b dc-a -> dc-b"], delays["dc-a--dc-b dc-b -> dc-a"]
    assert ab.ok and ba.ok, (ab, ba)
    assert abs(_delay_ms(ab) - 4.0) < 0.15 and abs(_delay_ms(ba) - 2.0) < 0.1
    rtt = delays[rtt_subject]
    assert rtt.ok and abs(_delay_ms(rtt) - 6.0) < 0.25
    shaper = shaper_for(shaped)
    with shaped.netlink("dc-a-rtr") as ipr:              # what host noise cannot touch is asserted first
        assert read_class_rate(ipr, "otn0") == 200e6
    with shaped.netlink("dc-b-rtr") as ipr:
        assert read_class_rate(ipr, "otn0") == 100e6
    throughput = check_throughput(shaped, shaper)
    assert all(c.ok for c in check_drops(shaper))
    for check in throughput:
        if not check.ok and _undisturbed_runs(check.measured) < THROUGHPUT_RUNS:
            pytest.skip(f"the host left fewer than {THROUGHPUT_RUNS} undisturbed runs: {check.measured}")
        assert check.ok, check


def _undisturbed_runs(measured: str) -> int:
    """Runs of a throughput check the host did not disturb, from its text ('best of N', 'D of them on a
    disturbed host')."""
    runs = int(measured.split("best of ")[1].split(" ")[0]) if "best of " in measured else 1
    disturbed = int(measured.split(" of them on a disturbed host")[0].rsplit(", ", 1)[1]) \
        if " of them on a disturbed host" in measured else 0
    return runs - disturbed


def test_undisturbed_runs_are_read_from_the_check() -> None:
    text = "95 Mbit/s (92.0% of the rate, 93.1% of expected), 0 retransmits, best of 6 (first 90.0% of expected), " \
           "3 of them on a disturbed host (CPU steal 7.0% > 5%)"
    assert _undisturbed_runs(text) == 3
    assert _undisturbed_runs("99 Mbit/s (99.0% of the rate, 100% of expected), 0 retransmits") == 1


def test_link_below_its_rate_fails_every_throughput_run(shaped) -> None:
    """The re-measures that forgive a host stall do not forgive a link 5 % short of its configured rate."""
    with shaped.netlink("dc-a-rtr") as ipr:
        change_rate(ipr, "otn0", 190e6)
    checks = _by_subject(check_throughput(shaped, shaper_for(shaped)))
    short = checks["dc-a--dc-b dc-a -> dc-b"]
    runs = int(short.measured.split("best of ")[1].split(" ")[0])
    assert not short.ok and THROUGHPUT_RUNS <= runs <= THROUGHPUT_RUNS + DISTURBED_RUNS, short
    assert float(short.measured.split("(")[1].split("%")[0]) < 92.0, short


def test_rules_sit_on_the_receivers_ingress(shaped) -> None:
    for node in ("dc-a-rtr", "dc-b-rtr"):
        rules = shaped.exec(node, ["iptables", "-t", "raw", "-S", "PREROUTING"], capture_output=True, text=True).stdout
        assert "-i otn0 -j NFQUEUE --queue-num 0" in rules
        out = shaped.exec(node, ["iptables", "-t", "mangle", "-S"], capture_output=True, text=True).stdout
        assert "NFQUEUE" not in out
    stats = shaper_for(shaped).health().details["daemons"]
    assert set(stats) == {"dc-a-rtr", "dc-b-rtr"}
    assert stats["dc-b-rtr"].queues[0].kernel_stamped > 0


def test_missing_delay_stage_fails_verification(shaped) -> None:
    shaped.exec("dc-b-rtr", ["iptables", "-t", "raw", "-F", "PREROUTING"], check=True)
    delays = _by_subject(check_delays(shaped, probes=5))
    assert not delays["dc-a--dc-b dc-a -> dc-b"].ok
    assert _delay_ms(delays["dc-a--dc-b dc-a -> dc-b"]) < 1.0
    assert delays["dc-a--dc-b dc-b -> dc-a"].ok          # the other direction is untouched
    assert any("NFQUEUE rule missing on dc-b-rtr" in p for p in shaper_for(shaped).health().problems)
    result = run_cli("verify", shaped.state.name, "--quick", check=False)
    assert result.returncode == 1 and "FAIL" in result.stdout


def test_killed_daemon_and_deleted_qdisc_are_detected(shaped) -> None:
    daemon = next(p for p in shaped.state.processes if p.node == "dc-b-rtr")
    os.kill(daemon.pid, signal.SIGKILL)
    time.sleep(0.2)
    status = json.loads(run_cli("status", shaped.state.name, "--json").stdout)
    assert status["health"].startswith("degraded") and "dc-b-rtr is dead" in status["health"]
    shaped.exec("dc-a-rtr", ["tc", "qdisc", "del", "dev", "otn0", "root"], check=True)
    problems = shaper_for(shaped).health().problems
    assert any("HTB rate class missing on dc-a-rtr:otn0" in p for p in problems)
    delays = _by_subject(check_delays(shaped, probes=3))
    assert "lost" in delays["dc-a--dc-b dc-a -> dc-b"].measured      # no listener: packets stop, loudly
    assert run_cli("verify", shaped.state.name, "--quick", check=False).returncode == 1


def test_link_set_changes_one_direction_at_run_time(shaped) -> None:
    run_cli("link", "set", "dc-a", "dc-b", "--name", shaped.state.name, "--from", "dc-b", "--delay", "7ms")
    backend = lifecycle.open_backend(shaped.state.name)
    delays = _delays_within(backend, {"dc-a--dc-b dc-b -> dc-a": (7.0, 0.25), "dc-a--dc-b dc-a -> dc-b": (4.0, 0.15)},
                            probes=8)
    assert abs(_delay_ms(delays["dc-a--dc-b dc-b -> dc-a"]) - 7.0) < 0.25
    assert abs(_delay_ms(delays["dc-a--dc-b dc-a -> dc-b"]) - 4.0) < 0.15
    refused = run_cli("link", "set", "dc-a", "dc-b", "--name", shaped.state.name, "--loss", "1%", check=False)
    assert refused.returncode == 1 and "lossless" in refused.stderr


def test_sigterm_releases_held_packets(tmp_path: Path) -> None:
    """A stopped daemon must release what it holds, not drop it."""
    from testbed.backends import nsfs
    from testbed.probe.latency import PROBE_PORT

    ns = f"tb-sigterm-{os.getpid()}"
    nsfs.create(ns)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "iptables", "-t", "raw", "-A", "OUTPUT", "-p", "udp", "--dport",
                        str(PROBE_PORT), "-j", "NFQUEUE", "--queue-num", "5"], check=True)
        config, stats = tmp_path / "c.json", tmp_path / "s.json"
        config.write_text(json.dumps({"queues": [{"queue": 5, "ifname": "lo", "delay_s": 30.0}]}))
        daemon = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "testbed.shaping.delayline",
                                   str(config), str(stats)], cwd=REPO)
        deadline = time.monotonic() + 10
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        import socket
        with nsfs.entered(ns):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind(("127.0.0.1", PROBE_PORT))
        rx.settimeout(5)
        for i in range(5):
            tx.sendto(b"held %d" % i, ("127.0.0.1", PROBE_PORT))
        time.sleep(0.3)
        rx.setblocking(False)
        with pytest.raises(BlockingIOError):
            rx.recv(100)                       # held for 30 s
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=10) == 0
        rx.settimeout(2)
        got = [rx.recv(100) for _ in range(5)]
        assert got == [b"held %d" % i for i in range(5)]
        rx.close()
        tx.close()
    finally:
        nsfs.remove(ns)


def test_delayline_passes_the_vm_tier_topology(unique_name: str) -> None:
    """The topology the netem shaper is verified on under the stock kernel (tests/test_vm.py), here with the
    delay line: same verification code, same tolerances."""
    from testbed.check.verify import verify_testbed

    topo = str(REPO / "tests" / "fixtures" / "topologies" / "2dc-vm.yaml")
    run_cli("up", topo, "--name", unique_name, "--shaper", "delayline", "--verify", "skip")
    try:
        report = verify_testbed(lifecycle.open_backend(unique_name), level="quick", probes=20)
        assert report.ok, report.failures()
    finally:
        run_cli("down", unique_name)


def test_delay_below_the_daemon_floor_uses_the_native_path_and_says_so(unique_name: str, tmp_path: Path) -> None:
    """0.05 ms is shorter than the daemon can time (the native-path threshold is the measured path + half the
    150 us wake-up floor, so at least 75 us on any machine): the direction runs without a hold on the delay
    line, is named so, and still verifies (the emulator's own path delivers 0.02-0.1 ms); back to a hold when
    it grows."""
    topo = tmp_path / "short.yaml"
    topo.write_text("name: short\ndatacenters: {dc-a: {hosts: 1}, dc-b: {hosts: 1}}\n"
                    "links: [{a: dc-a, b: dc-b, delay: 0.05ms, rate: 100mbit}]\n")
    up = run_cli("up", str(topo), "--name", unique_name, "--shaper", "delayline")
    try:
        assert "native path" in up.stderr
        backend = lifecycle.open_backend(unique_name)
        assert sorted(backend.state.shaper.native) == ["dc-a -> dc-b", "dc-b -> dc-a"]
        rules = backend.exec("dc-b-rtr", ["iptables", "-t", "raw", "-S", "PREROUTING"], capture_output=True,
                             text=True).stdout
        assert "NFQUEUE" not in rules
        assert "native path" in run_cli("status", unique_name).stdout
        run_cli("link", "set", "dc-a", "dc-b", "--name", unique_name, "--delay", "3ms")
        backend = lifecycle.open_backend(unique_name)
        assert backend.state.shaper.native == []
        delays = _delays_within(backend, {"dc-a--dc-b dc-a -> dc-b": (3.0, 0.15)}, probes=8)   # the hold is back
        assert abs(_delay_ms(delays["dc-a--dc-b dc-a -> dc-b"]) - 3.0) < 0.15
    finally:
        run_cli("down", unique_name)


def test_a_killed_delay_daemon_is_restarted_and_its_loss_is_counted(unique_name: str, tmp_path: Path) -> None:
    """kill -9 of a delay daemon in the middle of a training run: its supervisor starts it again within a
    second, training finishes, and the packets lost (held by the dead daemon or arriving before the new one
    bound its queue) are counted in the run's summary (not lossless), in `status` and in `verify`."""
    from testbed.shaping.supervisor import SupervisorStatus

    run_cli("up", "2dc-1000km", "--name", unique_name, "--shaper", "delayline", "--verify", "skip")
    try:
        status_file = Path(os.environ["TESTBED_STATE_DIR"]) / unique_name / "delayline-dc-b-rtr.status.json"
        first = SupervisorStatus.from_json(json.loads(status_file.read_text()))
        results = tmp_path / "results"
        run = subprocess.Popen([sys.executable, "-m", "testbed", "run", unique_name, "--schedule", "1f1b",
                                "--iterations", "12", "--microbatches", "8", "--results", str(results)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert run.stdout is not None
        for line in run.stdout:
            if "1f1b iteration 2:" in line:
                break
        os.kill(first.daemon_pid, signal.SIGKILL)
        output = run.stdout.read()
        assert run.wait(timeout=300) == 1, output               # finished, but says it was not lossless
        assert "lost on lossless links" in output and "1 delay daemon restart" in output, output
        after = SupervisorStatus.from_json(json.loads(status_file.read_text()))
        assert after.restarts == 1 and after.daemon_pid != first.daemon_pid and not after.gave_up
        assert after.deaths[0].how == "signal SIGKILL" and after.deaths[0].gap_s < 1.0, after
        (summary_file,) = results.glob("*/summary.json")
        summary = json.loads(summary_file.read_text())
        assert summary["daemon_restarts"] == 1 and not summary["lossless_ok"]
        into_b = next(lk for lk in summary["links"] if lk["dst_dc"] == "dc-b")
        assert into_b["drops_during_run"] > 0
        status = json.loads(run_cli("status", unique_name, "--json").stdout)
        assert status["health"] == "ok" and any("restarted 1" in e for e in status["shaper"]["events"])
        assert next(lk for lk in status["links"] if lk["dst_dc"] == "dc-b")["drops"] == into_b["drops_during_run"]
        verify = run_cli("verify", unique_name, "--quick", check=False)
        assert verify.returncode == 1 and "drops" in verify.stdout
    finally:
        run_cli("down", unique_name)
