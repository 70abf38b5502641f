"""Stock-kernel tier, RDMA across machines: the SSH lab (three "machines", each a namespace with its own sshd)
inside the 7.x guest, where rxe works in namespaces. `testbed remote`'s cycle gives each machine's NIC an rxe
device, trains over RDMA and over TCP on the same shaping, and teardown leaves no device. Runs inside QEMU
(make vm-test)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from sshlab import SshLab
from test_multihost import _inventory, _nothing_left, lab  # noqa: F401  (the lab fixture)
from test_vm_rdma import _unsupported_here

from playbooks.cycle import Cycle
from testbed.rdma import softroce
from testbed.remote.inventory import load_inventory
from testbed.run.runner import RunOptions

pytestmark = [pytest.mark.vm, pytest.mark.skipif(_unsupported_here() is not None, reason=str(_unsupported_here()))]

# Under TCG torch computes ~100x slower than natively: a small model (3 stages of one 32-wide layer).
SMALL = {"microbatches": 4, "microbatch_size": 1, "iterations": 2, "hang_timeout_s": 600, "memory_budget": "1f1b+1",
         "model": {"n_layer": 3, "n_embd": 32, "n_head": 2, "block_size": 16}}
# Each schedule is one launch of three workers (three torch imports, minutes each under TCG): the baseline only.
SCHEDULES = ["1f1b"]


def test_remote_cycle_trains_over_rdma_between_machines_and_leaves_no_rxe(lab: SshLab, tmp_path: Path,  # noqa: F811
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Under TCG every attempt is disturbed (the guest's clock and CPU are emulated): a repeat would measure nothing
    # new and cost three more torch imports, so each schedule is measured once here.
    monkeypatch.setattr("testbed.run.attempts.MAX_REPEATS", 0)
    cycle = Cycle(load_inventory(_inventory(lab)), "mh-rdma", tmp_path, log=lambda line: print(line, flush=True))
    names = [softroce.device_name("mh-rdma", i) for i in range(3)]
    times: dict[str, dict[str, float]] = {}
    try:
        cycle.preflight()
        cycle.provision()
        cycle.shape()
        cycle.verify()
        summaries, verified = {}, {}
        for transport in ("tcp", "rdma"):
            start = time.monotonic()
            run_dir, summary = cycle.run(RunOptions(schedules=SCHEDULES, transport=transport, **SMALL),
                                         run_id=f"run-{transport}")
            times[transport] = {"run_s": time.monotonic() - start,
                                **{s.schedule: s.step_time_s for s in summary.schedules}}
            summaries[transport] = json.loads((run_dir / "summary.json").read_text())
            verified[transport] = json.loads((run_dir / "verify.json").read_text())
        assert all(softroce.exists(n) for n in names)
    finally:
        failures = cycle.teardown()
        cycle.close()
    print("step times (s):", json.dumps(times, indent=1))
    assert not failures
    rdma, tcp = summaries["rdma"], summaries["tcp"]
    rdma_checks = [c for c in verified["rdma"] if c["kind"].startswith("rdma-")]   # per boundary between DCs:
    assert [c["kind"] for c in rdma_checks] == ["rdma-rtt", "rdma-rate", "rdma-rate"] * 2, rdma_checks
    assert all(c["ok"] for c in rdma_checks) and not any(c["kind"].startswith("rdma-") for c in verified["tcp"])
    assert tcp["transport"] == "gloo-tcp" and rdma["transport"].startswith("rdma-rc (SoftRoCE"), rdma["transport"]
    assert "every stage's machine has an rxe device" in rdma["transport_reason"]
    for ranks in rdma["transport_detail"].values():
        assert [r["device"] for r in ranks] == names and all(r["pool_bytes"] > 0 for r in ranks)
    for a, b in zip(tcp["schedules"], rdma["schedules"], strict=True):   # the same model, data and seed:
        assert math.isfinite(b["loss_first"])                            # RDMA carried the same tensors
        assert b["loss_first"] == pytest.approx(a["loss_first"], rel=1e-4) and b["budget_ok"]
    assert not any(softroce.exists(n) for n in names)
    _nothing_left(lab, "mh-rdma", wait_s=120)   # under TCG sshd took over 5 s to end the closed sftp session
