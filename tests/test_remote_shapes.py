"""The remote trim (testbed/remote/shapes.py) on scripted round trips, as tests/test_calibrate.py does the single
machine's: each machine's hold towards a DC is corrected by half the excess of the round trip through both ends'
holds, a disturbed reading is outvoted by a third, a small excess is left, and one past TRIM_LIMIT_S is left for
verify to see. Three machines on paper (tests/paperlab.py); no SSH."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from paperlab import paper_inventory

from testbed.remote import shapes as remote_shapes
from testbed.remote.fleet import Fleet, HostFacts
from testbed.remote.hostshape import plan_shapes
from testbed.remote.inventory import load_inventory
from testbed.remote.replies import RemovedReply, RttReply, ShapeReply

MS = 1e-3
ADDRESS = {"dc-a": "10.9.0.1", "dc-b": "10.9.0.2", "dc-c": "10.9.0.3"}
UNSHAPED_RTT_S = {frozenset("ab"): 0.4 * MS, frozenset("bc"): 0.6 * MS, frozenset("ac"): 1.0 * MS}
# per machine and peer DC: the excess of each round trip through the holds (the planned round trip comes on top)
EXCESS_READINGS_S = {
    ("dc-a-h1", "dc-b"): [0.30 * MS, 0.31 * MS],              # agree: the later is kept, half comes off each end
    ("dc-b-h1", "dc-a"): [0.30 * MS, 0.30 * MS],
    ("dc-a-h1", "dc-c"): [0.02 * MS, 0.03 * MS],              # within the readings' scatter: holds kept
    ("dc-c-h1", "dc-a"): [0.90 * MS, 0.20 * MS, 0.21 * MS],   # a disturbed first reading, outvoted by a third
    ("dc-b-h1", "dc-c"): [0.80 * MS, 0.80 * MS],              # past TRIM_LIMIT_S: left for verify to judge
    ("dc-c-h1", "dc-b"): [-0.20 * MS, -0.20 * MS],            # holds too short: made longer
}


class _Session:
    def __init__(self, installed: list[dict[str, Any]]) -> None:
        self.installed = installed

    def put(self, local: Path, _remote: str) -> None:
        self.installed.append(json.loads(local.read_text()))


class ScriptedFleet(Fleet):
    """The agent's replies scripted: round trips per machine and peer address, in the order the machine asks."""

    rtts: dict[tuple[str, str], list[float]]
    installed: dict[str, list[dict[str, Any]]]

    def agent(self, m, reply, *args, root=False, timeout_s=120):  # noqa: ANN001, ANN201 - Fleet.agent's signature
        assert root
        if args[0] == "unshape":
            return RemovedReply(removed=[])
        if args[0] == "shape":
            return ShapeReply(mode="delayline")
        assert args[0] == "rtt" and reply is RttReply, args
        with self.lock:
            queue = self.rtts[(m.name, args[1])]
            assert queue, f"{m.name} read the round trip to {args[1]} more often than scripted"
            return RttReply(values_s=[queue.pop(0)] * 10)


@pytest.fixture
def fleet(tmp_path: Path) -> ScriptedFleet:
    fleet = ScriptedFleet(load_inventory(paper_inventory(tmp_path)), "t", log=lambda _line: None)
    fleet.lock = threading.Lock()
    fleet.installed = defaultdict(list)
    planned = plan_shapes(fleet.inventory, "t")
    fleet.rtts = {}
    for m in fleet.inventory.machines:
        fleet.facts[m.name] = HostFacts(m.name, m.dc, m.login, home="/home/lab")
        fleet.sessions[m.name] = _Session(fleet.installed[m.name])
        for dc, address in ADDRESS.items():
            if dc == m.dc:
                continue
            peer = next(p for p in fleet.inventory.machines if p.dc == dc)
            through_holds = planned[m.name].delay_towards(dc) + planned[peer.name].delay_towards(m.dc)
            unshaped = UNSHAPED_RTT_S[frozenset((m.dc[-1], dc[-1]))]
            fleet.rtts[(m.name, address)] = [unshaped, *(through_holds + x for x in EXCESS_READINGS_S[(m.name, dc)])]
    return fleet


def test_each_end_takes_half_of_the_excess_it_and_its_peer_agree_on(fleet: ScriptedFleet) -> None:
    lines: list[str] = []
    fleet.log = lines.append
    shapes = remote_shapes.shape_machines(fleet)
    assert all(not left for left in fleet.rtts.values()), f"readings scripted but not taken: {fleet.rtts}"
    expected = {
        "dc-a-h1": {"dc-b": 0.2 * MS + 0.31 * MS / 2, "dc-c": 0.5 * MS},
        "dc-b-h1": {"dc-a": 0.2 * MS + 0.30 * MS / 2, "dc-c": 0.3 * MS},
        "dc-c-h1": {"dc-a": 0.5 * MS + 0.21 * MS / 2, "dc-b": 0.3 * MS - 0.20 * MS / 2},
    }
    for name, subtract in expected.items():
        assert shapes[name].subtract_s == pytest.approx(subtract), name
    # what each machine's agent was sent: its first shape (the unshaped one-way taken off), then the trimmed one
    # where something was trimmed; dc-a-h1's trim towards dc-c and dc-b-h1's towards dc-c are left alone
    sent = {name: [s["subtract_s"] for s in specs] for name, specs in fleet.installed.items()}
    assert sent["dc-a-h1"] == [pytest.approx({"dc-b": 0.2 * MS, "dc-c": 0.5 * MS}), pytest.approx(expected["dc-a-h1"])]
    assert sent["dc-b-h1"] == [pytest.approx({"dc-a": 0.2 * MS, "dc-c": 0.3 * MS}), pytest.approx(expected["dc-b-h1"])]
    assert sent["dc-c-h1"][-1] == pytest.approx(expected["dc-c-h1"]) and len(sent["dc-c-h1"]) == 2
    trims = [line for line in lines if "holds corrected by" in line]
    assert len(trims) == 3 and any("dc-b +155 us" in line for line in trims)


def test_a_machine_whose_excess_is_all_scatter_keeps_its_holds(fleet: ScriptedFleet) -> None:
    for key in EXCESS_READINGS_S:
        peer_address = ADDRESS[key[1]]
        unshaped, *through = fleet.rtts[(key[0], peer_address)]
        planned_rtt = through[-1] - EXCESS_READINGS_S[key][-1]
        fleet.rtts[(key[0], peer_address)] = [unshaped, planned_rtt + 0.04 * MS, planned_rtt - 0.04 * MS]
    lines: list[str] = []
    fleet.log = lines.append
    shapes = remote_shapes.shape_machines(fleet)
    assert sum("holds kept" in line for line in lines) == 3
    assert all(len(specs) == 1 for specs in fleet.installed.values())
    assert shapes["dc-a-h1"].subtract_s == pytest.approx({"dc-b": 0.2 * MS, "dc-c": 0.5 * MS})
