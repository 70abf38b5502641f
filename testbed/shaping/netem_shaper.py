"""The `netem` shaper, for kernels that have sch_netem: on the sender's OTN egress, HTB for the rate with
a netem leaf for delay (and jitter/loss for fault experiments), its `limit` sized from the plan.

netem's own lateness depends on the hold where timers are coarse (QEMU TCG, measured: +1.1 ms at a 1 ms
hold, +0.3-0.5 ms at 5-40 ms), so each direction is calibrated at the delay it is to deliver, at bring-up
and again whenever `link set` changes it."""

from __future__ import annotations

import dataclasses
from typing import Any

from testbed.plan.model import LinkDirection, Plan
from testbed.shaping import htb
from testbed.shaping.base import DirectionDrops, Health, Shaper
from testbed.shaping.calibrate import confirmed_excess, excess_one_way

CALIBRATION_AGREE_S = 100e-6
"""Two calibrations of one direction closer than this agree: rounds of probes vary by about +-75 us."""


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


def _delay_only(direction: LinkDirection) -> LinkDirection:
    """The direction without jitter or loss: what calibration probes cross (none may be lost)."""
    return dataclasses.replace(direction, jitter_s=0.0, loss=0.0)


class NetemShaper(Shaper):
    name = "netem"

    def apply(self, plan: Plan) -> None:
        for d in plan.directions:      # the asked delay first: calibrate the path as it will be used
            with self.backend.netlink(d.src_node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(d.src_node, d.src_ifname, d.rate_bps, netem_limit(d), leaf="netem",
                                                 netem=netem_options(_delay_only(d), 0.0)))
        self.apply_fabric(plan)
        for d in plan.directions:
            self.record.calibration_s[d.label] = excess_one_way(self.backend, d, d.delay_s)
        self.backend.state.save()
        for d in plan.directions:
            self._confirm(d)
            self._install(d)
        self.backend.state.save()

    def set_direction(self, direction: LinkDirection) -> None:
        """New values: the asked delay installed as it is, the path measured at it, then the hold corrected."""
        self._install(_delay_only(direction), base_s=0.0)
        self.record.calibration_s[direction.label] = excess_one_way(self.backend, direction, direction.delay_s)
        self._confirm(direction)
        self._install(direction)

    def _confirm(self, direction: LinkDirection) -> None:
        """The correction measured at the hold it keeps (without jitter or loss: no probe may be lost)."""
        self._install(_delay_only(direction))
        first = self.record.calibration_s[direction.label]
        self.record.calibration_s[direction.label] = confirmed_excess(self.backend, direction, first,
                                                                      CALIBRATION_AGREE_S)

    def _install(self, direction: LinkDirection, base_s: float | None = None) -> None:
        """Rate and netem options of one direction, its hold shortened by `base_s` (default: its calibration)."""
        base = self.record.calibration_s.get(direction.label, 0.0) if base_s is None else base_s
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
