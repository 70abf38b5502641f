"""The `netem` shaper, for kernels that have sch_netem: on the sender's OTN egress, HTB for the rate with
a netem leaf for delay (and jitter/loss for fault experiments), its `limit` sized from the plan.

netem's own lateness depends on the hold where timers are coarse (QEMU TCG, measured: +1.1 ms at a 1 ms
hold, +0.3-0.5 ms at 5-40 ms), so each direction is calibrated at the delay it is to deliver, at bring-up
and again whenever `link set` changes it.

The egress leaf (`NetemShaper.egress_leaf`: netem options and limit) is the one a remote machine's agent installs
under each destination's class too (testbed.remote.hostshape)."""

from __future__ import annotations

import dataclasses
from typing import Any

from testbed.plan.model import LinkDirection, Plan
from testbed.shaping import htb
from testbed.shaping.base import DirectionDrops, Health, Shaper, ShaperError
from testbed.shaping.calibrate import AGREE_S, confirmed_excess, excess_one_way

CALIBRATION_AGREE_S = AGREE_S
"""Two calibrations of one direction closer than this agree (calibrate.AGREE_S)."""


def netem_options(hold_s: float, jitter_s: float = 0.0, loss: float = 0.0) -> dict[str, Any]:
    """pyroute2 netem options: delay (never below zero) and jitter in microseconds, loss in percent."""
    opts: dict[str, Any] = {"delay": int(round(max(0.0, hold_s) * 1e6))}
    if jitter_s:
        opts["jitter"] = int(round(jitter_s * 1e6))
    if loss:
        opts["loss"] = loss * 100
    return opts


def netem_limit(rate_queue_packets: int, delay_queue_packets: int) -> int:
    """netem holds both the rate limiter's backlog and the packets in flight over the delay."""
    return rate_queue_packets + delay_queue_packets


def _delay_only(direction: LinkDirection) -> LinkDirection:
    """The direction without jitter or loss: what calibration probes cross (none may be lost)."""
    return dataclasses.replace(direction, jitter_s=0.0, loss=0.0)


class NetemShaper(Shaper):
    name = "netem"

    @classmethod
    def egress_leaf(cls, hold_s: float, rate_queue_packets: int, delay_queue_packets: int, jitter_s: float = 0.0,
                    loss: float = 0.0) -> tuple[int, dict[str, Any] | None]:
        return netem_limit(rate_queue_packets, delay_queue_packets), netem_options(hold_s, jitter_s, loss)

    def _leaf(self, direction: LinkDirection, base_s: float) -> tuple[int, dict[str, Any]]:
        """One direction's egress leaf, its hold shortened by `base_s`."""
        limit, options = self.egress_leaf(direction.delay_s - base_s, direction.rate_queue_packets,
                                          direction.delay_queue_packets, direction.jitter_s, direction.loss)
        return limit, options or {}

    def apply(self, plan: Plan) -> None:
        edged = [d.label for d in plan.directions if d.edge is not None]
        if edged:
            raise ShaperError(f"{', '.join(edged)}: an OTN edge buffer (lossless: pfc, a 'buffer' or an 'edge_rate') "
                              "is enforced by the delay line only; netem has no pause",
                              hint="bring the testbed up with --shaper delayline")
        for d in plan.directions:      # the asked delay first: calibrate the path as it will be used
            limit, options = self._leaf(_delay_only(d), 0.0)
            with self.backend.netlink(d.src_node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(d.src_node, d.src_ifname, d.rate_bps, limit, leaf="netem",
                                                 netem=options))
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
        limit, options = self._leaf(direction, base)
        with self.backend.netlink(direction.src_node) as ipr:
            index = ipr.link_lookup(ifname=direction.src_ifname)[0]
            htb.change_rate(ipr, direction.src_ifname, direction.rate_bps)
            ipr.tc("change", "netem", index=index, handle=htb.LEAF_HANDLE, parent=htb.CLASS_HANDLE,
                   limit=limit, **options)

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
