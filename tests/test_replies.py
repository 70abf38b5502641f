"""The agent's replies are typed: each command's JSON reads back as its dataclass, round-trips, and the agent
itself prints exactly those fields."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest

from testbed.remote.replies import REPLIES, CountersReply, LoadReply, PortReply, RttReply


@pytest.mark.parametrize("command", sorted(REPLIES))
def test_every_reply_round_trips_and_ignores_keys_it_does_not_know(command: str) -> None:
    cls = REPLIES[command]
    reply = cls()
    assert cls.from_json(json.loads(json.dumps(reply.to_json()))) == reply
    assert cls.from_json({**reply.to_json(), "from_a_newer_agent": 1}) == reply


def test_counters_and_rtt_carry_their_figures() -> None:
    counters = CountersReply(egress={"dc-b": 0}, ingress={"dc-b": 2}, holds={"dc-b": [10, 0.0004]})
    assert CountersReply.from_json(json.loads(json.dumps(counters.to_json()))) == counters
    sample = RttReply(values_s=[0.010, 0.012, 0.011, 0.013], lost=0).sample()
    assert sample.median_s == pytest.approx(0.0115) and sample.iqr_s > 0


@pytest.mark.parametrize(("args", "cls"), [(["load"], LoadReply), (["freeport", "127.0.0.1"], PortReply)])
def test_the_agent_prints_its_reply_type(args: list[str], cls: type) -> None:
    out = subprocess.run([sys.executable, "-m", "testbed.remote.agent", *args], capture_output=True, text=True,
                         check=True).stdout
    data = json.loads(out)
    assert set(data) == {f.name for f in fields(cls)}
    reply = cls.from_json(data)
    assert (reply.cpu and reply.cpus) if cls is LoadReply else reply.port > 0


def test_the_rdma_probe_result_is_read_back_as_itself() -> None:
    """RDMA verify reads the probe's JSON as the probe's own ProbeResult (no hand copy of its fields)."""
    from testbed.rdma.probe import ProbeResult

    result = ProbeResult(one_way_s=0.0051, one_way_min_s=0.005, one_way_p90_s=0.006, goodput_bps=9e8, bulk_s=0.1,
                         size=262144, count=16, qps=2, rdma_mtu=4096, transfer_s=[0.005, 0.0052])
    assert ProbeResult.from_json({**json.loads(json.dumps(result.to_json())), "extra": 1}) == result
