"""The SSH-driven cycle for real: three "machines" (namespaces with their own sshd and host key) joined by a
management and a data network, driven over SSH by the playbooks exactly as real hosts would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch  # noqa: F401,E402  (a broken install fails here, it does not skip)
import yaml
from contract import check_summary
from sshlab import DATA_NIC, SshLab
from terminal import _wait_for
from test_interrupts import SMALL

from playbooks.cycle import Cycle, CycleError, full_cycle  # noqa: E402
from testbed.plan.builder import build_plan  # noqa: E402
from testbed.remote.hostshape import STATE_DIR  # noqa: E402
from testbed.remote.inventory import load_inventory  # noqa: E402
from testbed.remote.verify import rtt_check  # noqa: E402
from testbed.run.runner import RunError, RunOptions  # noqa: E402
from testbed.run.transport import TransportError  # noqa: E402

pytestmark = [pytest.mark.multihost, pytest.mark.root]
TOPOLOGY = Path(__file__).parent / "fixtures" / "multihost" / "3dc-lab.yaml"
PYTHON = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    lab = SshLab(tmp_path_factory.mktemp("sshlab"), f"tbl{os.getpid() % 10000}", 3, net=20 + os.getpid() % 200)
    try:
        yield lab.open()
    finally:
        lab.close()


def _inventory(lab: SshLab, **host_overrides: dict) -> Path:
    hosts = {f"dc-{c}-h1": {"address": h.mgmt, "data_address": h.data, "workdir": str(lab.root / h.name / "work")}
             for c, h in zip("abc", lab.hosts, strict=True)}
    for name, extra in host_overrides.items():
        hosts[name].update(extra)
    python = PYTHON if Path(PYTHON).exists() else "/usr/bin/python3"
    path = lab.root / "inventory.yaml"
    path.write_text(yaml.safe_dump({"topology": str(TOPOLOGY), "known_hosts": str(lab.known_hosts),
                                    "defaults": {"user": "root", "key": str(lab.client_key), "nic": DATA_NIC,
                                                 "python": python},
                                    "hosts": hosts}))
    return path


def _nothing_left(lab: SshLab, testbed: str, wait_s: float = 5.0) -> None:
    """Only the lab's own sshd listeners run in the machines (the cycle's closed sessions given `wait_s` to end);
    no qdisc, rule, state file or run folder remains."""
    deadline = time.monotonic() + wait_s
    while True:
        others = [p for p in lab.processes() if b"[listener]" not in _cmdline(p)]
        if not others or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not others, [_cmdline(p) for p in others]
    for h in lab.hosts:
        qdiscs = subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "show", "dev", DATA_NIC],
                                capture_output=True, text=True).stdout
        assert "htb" not in qdiscs, (h.name, qdiscs)
        rules = subprocess.run(["ip", "netns", "exec", h.netns, "iptables", "-w", "-t", "raw", "-S"],
                               capture_output=True, text=True).stdout
        assert "tb-remote" not in rules, (h.name, rules)
        assert not (lab.root / h.name / "work" / "runs").exists()
    assert not (STATE_DIR / testbed).exists()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


@pytest.mark.slow
def test_full_cycle_over_ssh_meets_the_single_machine_contract(lab: SshLab, tmp_path: Path) -> None:
    inventory = load_inventory(_inventory(lab))
    options = RunOptions(schedules=["1f1b", "geopipe"], microbatches=8, iterations=2, memory_budget="1f1b+2",
                         model={"n_layer": 3, "n_embd": 64, "n_head": 4, "block_size": 64})
    lines: list[str] = []
    run_dir, summary, cycle = full_cycle(inventory, options, testbed="mh", results_root=tmp_path, log=lines.append)
    data = json.loads((run_dir / "summary.json").read_text())
    check_summary(data, ["1f1b", "geopipe"], stages=3)
    assert data["backend"] == "remote-ssh" and data["shaper"] == "delayline"
    assert [s["host"] for s in data["stages"]] == ["dc-a-h1", "dc-b-h1", "dc-c-h1"]
    assert [round(lk["delay_s"], 4) for lk in data["stage_links"]] == [0.004, 0.003]
    assert data["oversubscribed"]                          # three "machines" share this box's kernel and cores
    one, geo = data["schedules"]
    assert geo["step_time_s"] < one["step_time_s"]          # 4 + 3 ms links: geopipe hides what 1f1b waits for
    assert geo["geopipe_sizing"]["extra_inflight"][0] >= 1
    assert all(c["ok"] for c in json.loads((run_dir / "verify.json").read_text()))
    hosts = {p.stem: json.loads(p.read_text()) for p in (run_dir / "hosts").glob("*.json")}
    assert set(hosts) == {"dc-a-h1", "dc-b-h1", "dc-c-h1"}
    for facts in hosts.values():
        assert facts["env"]["package"].startswith(str(lab.root))     # the provisioned copy ran, not this checkout
        assert abs(facts["clock_offset_s"]) < 0.01 and facts["torch"]
    trace = json.loads((run_dir / "trace.json").read_text())
    assert any(e.get("name") == "F0" for e in trace["traceEvents"])
    assert set(cycle.step_s) >= {"preflight", "provision", "shape", "verify", "run", "teardown"}
    assert not any(str(lab.client_key.read_text()).strip() in line for line in lines)
    _nothing_left(lab, "mh")
    # provisioning is idempotent: the same tree is found, not copied again
    again = Cycle(inventory, "mh", tmp_path, log=lines.append)
    try:
        again.preflight()
        again.provision()
    finally:
        again.close()
    assert sum("present" in line for line in lines[-3:]) == 3


def _htb_rates(lab: SshLab) -> dict[str, set[str]]:
    """Per lab machine, the HTB class rates on its data NIC, read from the kernel in its namespace."""
    out = {}
    for h in lab.hosts:
        text = subprocess.run(["ip", "netns", "exec", h.netns, "tc", "class", "show", "dev", DATA_NIC],
                              capture_output=True, text=True).stdout
        out[h.name] = {line.split(" rate ")[1].split()[0] for line in text.splitlines() if " rate " in line}
    return out


def test_shaping_is_in_the_kernel_while_it_runs_and_gone_after(lab: SshLab, tmp_path: Path) -> None:
    """Shaped: every machine's NIC has HTB classes at the link rate (50 Mbit/s) towards the other DCs, read back
    from the kernel in the lab's namespaces; verify's goodput stays under its ceiling; after teardown no class
    is left (so 'nothing left' is checked against something that was there)."""
    cycle = Cycle(load_inventory(_inventory(lab)), "mh-tc", tmp_path, log=lambda _: None)
    try:
        cycle.preflight()
        cycle.provision()
        cycle.shape()
        rates = _htb_rates(lab)
        assert all("50Mbit" in found for found in rates.values()), rates
        throughput = [c for c in cycle.verify() if c.kind == "throughput"]
        assert throughput and all(c.ok for c in throughput), throughput
    finally:
        cycle.teardown()
        cycle.close()
    assert all(not found for found in _htb_rates(lab).values())
    _nothing_left(lab, "mh-tc")


def test_up_then_run_then_down_from_the_cli(lab: SshLab, tmp_path: Path) -> None:
    """`testbed remote up`, `run` (on the shaping `up` left, found through the public attach step) and `down`,
    each a command of its own as a user types them; the run meets the contract and down leaves nothing."""
    inventory, name = _inventory(lab), "mh-cli"

    def remote(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "testbed", "remote", *args, str(inventory), "--name", name,
                               "--results", str(tmp_path)], capture_output=True, text=True, timeout=900)

    try:
        up = remote("up")
        assert up.returncode == 0, up.stderr[-2000:]
        run = remote("run", "--schedule", "1f1b,geopipe", "--microbatches", "8", "--iterations", "2", "--layers", "3",
                     "--width", "64", "--memory-budget", "1f1b+2")
        assert run.returncode == 0, run.stderr[-2000:]
        assert "shaped (" in run.stdout or "shaped (" in run.stderr
    finally:
        down = remote("down")
    assert down.returncode == 0, down.stderr[-2000:]
    data = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    check_summary(data, ["1f1b", "geopipe"], stages=3)
    _nothing_left(lab, name)


def test_shaping_twice_measures_the_network_not_the_last_shape(lab: SshLab, tmp_path: Path) -> None:
    """`up` run again replaces this testbed's shaping; the network's own latency is measured unshaped each time."""
    cycle = Cycle(load_inventory(_inventory(lab)), "mh-twice", tmp_path, log=lambda _: None)
    try:
        cycle.preflight()
        cycle.provision()
        cycle.shape()
        cycle.shape()
        assert all(0 <= s < 1e-3 for shape in cycle.shapes.values() for s in shape.subtract_s.values()), cycle.shapes
        a, b = cycle.inventory.machines[:2]
        check = rtt_check(cycle, build_plan(cycle.inventory.topology, "mh-twice"), cycle.shapes, a, b)
        assert check.ok, check
    finally:
        cycle.teardown()
        cycle.close()
    _nothing_left(lab, "mh-twice")


def test_unreachable_machine_fails_fast_names_it_and_touches_nothing(lab: SshLab, tmp_path: Path) -> None:
    down = lab.hosts[2]
    lab.stop_sshd(down)
    try:
        inventory = load_inventory(_inventory(lab))
        start = time.monotonic()
        with pytest.raises(CycleError) as err:
            full_cycle(inventory, RunOptions(schedules=["1f1b"]), testbed="mh-down", results_root=tmp_path,
                       log=lambda _: None)
        assert time.monotonic() - start < 30
    finally:
        down.sshd = lab.start_sshd(down)
    message = str(err.value)
    assert "dc-c-h1: unreachable" in message and "connection refused" in message and "dc-a-h1" not in message
    _nothing_left(lab, "mh-down")
    assert not any((lab.root / h.name / "work").exists() and any((lab.root / h.name / "work").glob("*mh-down*"))
                   for h in lab.hosts)


def test_rdma_where_a_machine_has_no_rxe_fails_before_shaping_and_names_it(lab: SshLab, tmp_path: Path) -> None:
    """This host's kernel has no rdma_rxe (the stock-kernel tier runs the RDMA cycle: tests/test_vm_remote_rdma.py):
    `--transport rdma` stops after provisioning, each machine named with its kernel's answer, nothing shaped."""
    from testbed.rdma.support import rxe_here

    if rxe_here().ok:
        pytest.skip("this kernel runs rxe: tests/test_vm_remote_rdma.py covers it")
    lines: list[str] = []
    with pytest.raises(TransportError, match=r"--transport rdma cannot run: dc-a-h1: .*rdma_rxe.*dc-c-h1: .*Routes"):
        full_cycle(load_inventory(_inventory(lab)), RunOptions(schedules=["1f1b"], transport="rdma"), testbed="mh-rdma",
                   results_root=tmp_path, log=lines.append)
    assert any("rxe no (" in line for line in lines) and not any(line.lstrip().startswith("shape") for line in lines)
    _nothing_left(lab, "mh-rdma")


def test_a_model_that_cannot_fill_the_machines_fails_before_any_ssh(lab: SshLab, tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(RunError, match="2 layers cannot fill 3 stages"):
        full_cycle(load_inventory(_inventory(lab)), RunOptions(schedules=["1f1b"], model={"n_layer": 2}),
                   testbed="mh-early", results_root=tmp_path, log=lines.append)
    assert lines == []


def test_wrong_host_key_is_refused_and_unknown_key_needs_consent(lab: SshLab, tmp_path: Path) -> None:
    good = lab.known_hosts.read_text()
    a, b, c = lab.hosts
    try:
        lab.known_hosts.write_text(good.replace(b.host_key_pub, c.host_key_pub))    # b presents another key
        inventory = load_inventory(_inventory(lab))
        with pytest.raises(CycleError) as err:
            full_cycle(inventory, RunOptions(schedules=["1f1b"]), testbed="mh-key", results_root=tmp_path,
                       log=lambda _: None)
        assert "dc-b-h1: the host key of" in str(err.value) and "differs" in str(err.value)
        _nothing_left(lab, "mh-key")
        lab.known_hosts.write_text("".join(line + "\n" for line in good.splitlines() if not line.startswith(b.mgmt + " ")))
        cycle = Cycle(load_inventory(_inventory(lab)), "mh-key", tmp_path, log=lambda _: None)
        with pytest.raises(CycleError, match="dc-b-h1: .* is not in .*accept_new_host_key"):
            cycle.preflight()
        cycle.close()
        cycle = Cycle(load_inventory(_inventory(lab, **{"dc-b-h1": {"accept_new_host_key": True}})), "mh-key", tmp_path,
                      log=lambda _: None)
        cycle.preflight()                                   # trusted on first contact, and remembered
        cycle.close()
        assert b.host_key_pub.split()[1] in lab.known_hosts.read_text()
    finally:
        lab.known_hosts.write_text(good)


def test_commands_are_argument_lists_quoted_not_interpolated(lab: SshLab, tmp_path: Path) -> None:
    """A workdir with spaces and shell characters stays one argument on the far side."""
    odd = str(lab.root / "h1" / "odd dir; touch INJECTED")
    inventory = load_inventory(_inventory(lab, **{"dc-a-h1": {"workdir": odd}}))
    cycle = Cycle(inventory, "mh-quote", tmp_path, log=lambda _: None)
    try:
        cycle.preflight()
        cycle.provision()
    finally:
        cycle.close()
    assert Path(odd).is_dir() and not Path("INJECTED").exists() and not (lab.root / "h1" / "INJECTED").exists()


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_cycle_stopped_mid_run_tears_down_every_machine(stop: str, lab: SshLab, tmp_path: Path,
                                                        terminal) -> None:
    """Ctrl-C typed in a real terminal (or kill -TERM) while the machines train: the workers stop, the shaping
    goes, every machine is as before."""
    inventory = _inventory(lab)
    term = terminal([sys.executable, "-m", "testbed", "remote", "cycle", str(inventory), "--name", "mhint",
                     "--schedule", "1f1b", "--iterations", "40", "--results", str(tmp_path), *SMALL, "--layers", "3"])
    _wait_for(lambda: "iteration 2:" in term.output(), "training on the machines", term)
    (term.ctrl_c if stop == "SIGINT" else lambda: os.kill(term.pid, signal.SIGTERM))()
    term.wait_exit()
    assert term.status() == (130 if stop == "SIGINT" else 143), term.output()
    assert "teardown" in term.output() and f"received {stop}" in term.output()
    _nothing_left(lab, "mhint")
