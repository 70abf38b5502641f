"""The `netem` shaper, for kernels that have sch_netem: on the sender's OTN egress, HTB for the rate with
a netem leaf for delay (and jitter/loss for fault experiments), its `limit` sized from the plan."""

from __future__ import annotations

from typing import Any

from testbed.plan.model import LinkShape, Plan
from testbed.shaping import htb
from testbed.shaping.base import DirectionDrops, Health, Shaper, direction_label, field_of
from testbed.shaping.calibrate import CALIBRATION_HOLD_S, base_one_way


def netem_options(shape: LinkShape | dict[str, Any], base_s: float) -> dict[str, Any]:
    """pyroute2 netem options: delay and jitter in microseconds, loss in percent."""
    def get(key: str) -> Any:
        return field_of(shape, key)

    opts: dict[str, Any] = {"delay": int(round(max(0.0, get("delay_s") - base_s) * 1e6))}
    if get("jitter_s"):
        opts["jitter"] = int(round(get("jitter_s") * 1e6))
    if get("loss"):
        opts["loss"] = get("loss") * 100
    return opts


class NetemShaper(Shaper):
    name = "netem"

    def apply(self, plan: Plan) -> None:
        hold_us = int(CALIBRATION_HOLD_S * 1e6)
        for shape in plan.shapes:      # a known hold first: calibrate the path as it will be used
            with self.backend.netlink(shape.src_node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(shape.src_node, shape.src_ifname, shape.rate_bps,
                                                 self._limit(shape), leaf="netem", netem={"delay": hold_us}))
        self.apply_fabric(plan)
        calibration = base_one_way(self.backend, installed_hold_s=CALIBRATION_HOLD_S)
        self.backend.state.extra["shaper"] = {"name": self.name, "calibration_s": calibration}
        self.backend.state.save()
        for shape in plan.shapes:
            self.set_direction(shape)

    @staticmethod
    def _limit(shape: LinkShape | dict[str, Any]) -> int:
        def get(key: str) -> Any:
            return field_of(shape, key)

        return int(get("rate_queue_packets") + get("delay_queue_packets"))

    def set_direction(self, shape: LinkShape) -> None:
        base = self.backend.state.extra["shaper"]["calibration_s"].get(direction_label(shape), 0.0)
        with self.backend.netlink(shape.src_node) as ipr:
            index = ipr.link_lookup(ifname=shape.src_ifname)[0]
            htb.change_rate(ipr, shape.src_ifname, shape.rate_bps)
            ipr.tc("change", "netem", index=index, handle=htb.LEAF_HANDLE, parent=htb.CLASS_HANDLE,
                   limit=self._limit(shape), **netem_options(shape, base))

    def health(self) -> Health:
        report = Health(problems=self.qdisc_problems())
        for shape in self.backend.state.plan.get("shapes", []):
            with self.backend.netlink(shape["src_node"]) as ipr:
                kinds = [q.kind for q in htb.read_qdiscs(ipr, shape["src_ifname"])]
            if "netem" not in kinds:
                report.problems.append(f"{direction_label(shape)}: netem qdisc missing on "
                                       f"{shape['src_node']}:{shape['src_ifname']}")
        return report

    def drops(self) -> list[DirectionDrops]:
        return [DirectionDrops(link=s["link"], direction=direction_label(s), qdisc_drops=self.qdisc_drops(s))
                for s in self.backend.state.plan.get("shapes", [])]
