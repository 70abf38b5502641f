"""The `netem` shaper, for kernels that have sch_netem: on the sender's OTN egress, HTB for the rate with
a netem leaf for delay (and jitter/loss for fault experiments), its `limit` sized from the plan."""

from __future__ import annotations

from typing import Any

from testbed.plan.model import LinkDirection, Plan
from testbed.shaping import htb
from testbed.shaping.base import DirectionDrops, Health, Shaper
from testbed.shaping.calibrate import CALIBRATION_HOLD_S, base_one_way


def netem_options(direction: LinkDirection, base_s: float) -> dict[str, Any]:
    """pyroute2 netem options: delay and jitter in microseconds, loss in percent."""
    opts: dict[str, Any] = {"delay": int(round(max(0.0, direction.delay_s - base_s) * 1e6))}
    if direction.jitter_s:
        opts["jitter"] = int(round(direction.jitter_s * 1e6))
    if direction.loss:
        opts["loss"] = direction.loss * 100
    return opts


def netem_limit(direction: LinkDirection) -> int:
    """netem holds both the rate limiter's backlog and the packets in flight over the delay."""
    return direction.rate_queue_packets + direction.delay_queue_packets


class NetemShaper(Shaper):
    name = "netem"

    def apply(self, plan: Plan) -> None:
        hold_us = int(CALIBRATION_HOLD_S * 1e6)
        for d in plan.directions:      # a known hold first: calibrate the path as it will be used
            with self.backend.netlink(d.src_node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(d.src_node, d.src_ifname, d.rate_bps, netem_limit(d), leaf="netem",
                                                 netem={"delay": hold_us}))
        self.apply_fabric(plan)
        self.record.calibration_s = base_one_way(self.backend, installed_hold_s=CALIBRATION_HOLD_S)
        self.backend.state.save()
        for d in plan.directions:
            self.set_direction(d)

    def set_direction(self, direction: LinkDirection) -> None:
        base = self.record.calibration_s.get(direction.label, 0.0)
        with self.backend.netlink(direction.src_node) as ipr:
            index = ipr.link_lookup(ifname=direction.src_ifname)[0]
            htb.change_rate(ipr, direction.src_ifname, direction.rate_bps)
            ipr.tc("change", "netem", index=index, handle=htb.LEAF_HANDLE, parent=htb.CLASS_HANDLE,
                   limit=netem_limit(direction), **netem_options(direction, base))

    def health(self) -> Health:
        report = Health(problems=self.qdisc_problems())
        for d in self.directions:
            with self.backend.netlink(d.src_node) as ipr:
                kinds = [q.kind for q in htb.read_qdiscs(ipr, d.src_ifname)]
            if "netem" not in kinds:
                report.problems.append(f"{d.label}: netem qdisc missing on {d.src_node}:{d.src_ifname}")
        return report

    def drops(self) -> list[DirectionDrops]:
        return [DirectionDrops(link=d.link, direction=d.label, qdisc_drops=self.qdisc_drops(d)) for d in self.directions]
