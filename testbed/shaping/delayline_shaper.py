"""The `delayline` shaper, for kernels without netem: rate by HTB on the sender's OTN egress, delay by an
NFQUEUE verdict daemon on the receiver's ingress (iptables raw PREROUTING), one daemon per receiving router,
installed by `delayline_install` (as each remote machine's is).

Queueing on the receiver's ingress (not the sender's egress) keeps TCP Small Queues from throttling the
sender; the rule has no --queue-bypass, so a dead daemon stops the link's traffic (loud) instead of
letting it through undelayed (silent).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from testbed.plan.model import LinkDirection, Plan
from testbed.shaping import htb
from testbed.shaping.base import DirectionDrops, Health, Shaper, ShaperError
from testbed.shaping.calibrate import AGREE_S, CALIBRATION_HOLD_S, agreed, base_one_way, correction, excess_one_way
from testbed.shaping.delayline import DaemonStats, QueueConfig, Timing
from testbed.shaping.delayline_install import (
    DELIVERED_COMMENT,
    DelayLineInstall,
    IptablesRule,
    NodePlace,
    delivered_rule,
    hold,
    iptables_binary,
    listing,
    nfqueue_rule,
    queue_counters,
    rule_packets,
    write_config,
)
from testbed.shaping.otn_edge import EdgeConfig, EdgeCounters
from testbed.shaping.supervisor import SupervisorStatus
from testbed.state.records import DaemonFiles, ProcessRecord

WAKEUP_FLOOR_S = 150e-6
"""A hold shorter than this cannot be timed: the daemon needs ~0.1-0.2 ms to wake on a packet's arrival."""
STATS_STALE_S = 3.0
TRIM_THRESHOLD_S = 20e-6
"""A residual below this after the first calibration is left alone: the probe's own resolution."""
TRIM_AGREE_S = AGREE_S
"""Two trim readings closer than this agree (the later is kept); further apart, a third decides (calibrate.agreed)."""
ROLE = "delayline"
"""The role of its supervisors among the testbed's processes."""


def queue_number(ifname: str) -> int:
    """Queue number of an OTN interface: `otn3` -> 3 (unique within the receiving namespace)."""
    return int(ifname.removeprefix("otn"))


def hold_rule(ifname: str) -> IptablesRule:
    """The NFQUEUE rule of one incoming OTN interface: the interface carries one link, so it selects by `-i`."""
    return nfqueue_rule(queue_number(ifname), "-i", ifname)


def queue_config(direction: LinkDirection, subtract: dict[str, float]) -> QueueConfig:
    """Daemon config of one direction: hold for the planned delay minus `subtract[direction]`."""
    return hold(queue_number(direction.dst_ifname), direction.dst_ifname, direction.delay_s,
                subtract.get(direction.label, 0.0), rate_bps=direction.rate_bps, mtu=direction.mtu,
                maxlen=direction.delay_queue_packets, jitter_s=direction.jitter_s, loss=direction.loss,
                edge=edge_config(direction))


def edge_config(direction: LinkDirection) -> EdgeConfig | None:
    """The daemon's view of a direction's OTN edge (None: a plain hold)."""
    e = direction.edge
    if e is None:
        return None
    return EdgeConfig(e.mode, direction.rate_bps, e.drain_rate_bps, e.buffer_bytes, e.xoff_bytes, e.xon_bytes,
                      e.headroom_bytes, e.pause_delay_s)


class DelaylineShaper(Shaper):
    name = "delayline"
    delays_ingress = True
    daemon_role = ROLE

    # -- files of this testbed's daemons ---------------------------------------------------------
    def _files(self, node: str) -> DaemonFiles:
        d = self.backend.state.files_dir
        d.mkdir(parents=True, exist_ok=True)
        return DaemonFiles(config=str(d / f"delayline-{node}.json"), stats=str(d / f"delayline-{node}.stats.json"),
                           log=str(d / f"delayline-{node}.log"), status=str(d / f"delayline-{node}.status.json"))

    def _line(self, node: str) -> DelayLineInstall:
        """The node's delay line as installed (its files from the testbed's state)."""
        return DelayLineInstall(NodePlace(self.backend, node), self.record.daemons[node])

    def _place(self, node: str) -> NodePlace:
        return NodePlace(self.backend, node)

    # -- apply ------------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        if not iptables_binary():
            raise ShaperError("the delayline shaper needs iptables with the NFQUEUE target",
                              hint="apt-get install iptables")
        for d in plan.directions:
            with self.backend.netlink(d.src_node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(d.src_node, d.src_ifname, d.rate_bps, d.rate_queue_packets))
        self.apply_fabric(plan)
        record = self.record
        incoming: dict[str, list[LinkDirection]] = defaultdict(list)
        for d in plan.directions:
            incoming[d.dst_node].append(d)
        hold_s = {d.label: d.delay_s - CALIBRATION_HOLD_S for d in plan.directions}
        for node, directions in incoming.items():
            line = DelayLineInstall(self._place(node), self._files(node))
            line.configure([queue_config(d, hold_s) for d in directions], timing=Timing())
            line.start(lambda pid, node=node: self._started(pid, node))
            record.daemons[node] = line.files
            self.backend.state.save()
            for d in directions:
                line.add(delivered_rule(d.dst_ifname))
                line.add(hold_rule(d.dst_ifname))
        self._calibrate(incoming)

    def _started(self, pid: int, node: str) -> None:
        self.backend.state.processes.append(ProcessRecord.of(pid, ROLE, node))
        self.backend.state.save()

    def _incoming(self) -> dict[str, list[LinkDirection]]:
        incoming: dict[str, list[LinkDirection]] = defaultdict(list)
        for d in self.directions:
            incoming[d.dst_node].append(d)
        return incoming

    def _calibrate(self, incoming: dict[str, list[LinkDirection]]) -> None:
        """Every direction held CALIBRATION_HOLD_S is measured, its hold set to the asked delay less the path's
        own latency (or the native path), then trimmed at the hold it keeps."""
        record = self.record
        for node, directions in incoming.items():
            self._configure(node, [queue_config(d, {d.label: d.delay_s - CALIBRATION_HOLD_S}) for d in directions])
        record.calibration_s = base_one_way(self.backend, installed_hold_s=CALIBRATION_HOLD_S)
        record.native, record.warnings = [], []
        for d in self.directions:
            self._place_hold(d)
        self.backend.state.save()
        for node, directions in incoming.items():
            self._configure(node, [queue_config(d, record.calibration_s) for d in directions])
        self._trim(incoming)

    def retime(self, timing: Timing) -> None:
        """Every daemon keeps time the new way (priority, spinning), and the links are calibrated again: a
        daemon's lateness is part of what the calibration subtracts."""
        incoming = self._incoming()
        for d in self.directions:
            if d.label in self.record.native:                  # calibrated with its hold like every other
                self._hold_again(d)
        for node in incoming:
            self._configure(node, self._line(node).config().queues, timing=timing)
        self._calibrate(incoming)

    def timing(self) -> Timing:
        """How the daemons keep time (their configuration files)."""
        for node in self.record.daemons:
            return self._line(node).config().timing
        return Timing()

    def _trim(self, incoming: dict[str, list[LinkDirection]]) -> None:
        """Closed loop: each held direction measured again at its real hold, re-corrected by the residual.

        The first calibration holds CALIBRATION_HOLD_S, and a daemon may wake later after longer holds; measured
        at the hold it will keep, the excess is what later packets pay. Two readings (the first calibration and
        one at the kept hold) within TRIM_AGREE_S keep the later, else a third decides (calibrate.agreed); a
        change within TRIM_THRESHOLD_S is not made."""
        record = self.record
        for node, directions in incoming.items():
            changed = False
            for d in directions:
                if d.label in record.native:
                    continue
                hold_s = d.delay_s - record.calibration_s[d.label]
                before = self._fresh_counters(node).get(d.label, (0, 0.0))
                first = record.calibration_s[d.label]
                excess = agreed(first, excess_one_way(self.backend, d, hold_s),
                                lambda d=d, hold_s=hold_s: excess_one_way(self.backend, d, hold_s), TRIM_AGREE_S)
                after = self._fresh_counters(node).get(d.label, (0, 0.0))
                if after[0] > before[0]:
                    record.release_error_s[d.label] = (after[1] - before[1]) / (after[0] - before[0])
                if correction(excess - first, TRIM_THRESHOLD_S):
                    record.calibration_s[d.label], changed = excess, True
            if changed:
                self._configure(node, [queue_config(d, record.calibration_s) for d in directions])
        self.backend.state.save()

    def _fresh_counters(self, node: str) -> dict[str, tuple[int, float]]:
        """hold_counters() with the node's daemon made to write its statistics now (a reload of the same
        configuration: the daemon writes them when it takes a new generation)."""
        self._configure(node, self._line(node).config().queues)
        return self.hold_counters()

    def _place_hold(self, direction: LinkDirection) -> None:
        """A hold on the delay line, or the native path, for one direction, with a warning that names which.

        A hold shorter than the daemon's wake-up cannot be timed; when the asked delay is nearer the emulator's
        own path latency than the shortest hold plus that latency, the direction gets no hold and its path
        itself delivers the delay ('native path'); verify measures it like any other."""
        record = self.record
        label = direction.label
        path = record.calibration_s[label]
        native = direction.delay_s < path + WAKEUP_FLOOR_S / 2 and direction.edge is None   # an edge needs the line
        was_native = label in record.native
        if native and not was_native:
            self._line(direction.dst_node).delete(hold_rule(direction.dst_ifname))
            record.native.append(label)
        elif was_native and not native:
            self._hold_again(direction)
        record.warnings = [w for w in record.warnings if not w.startswith(label + ":")]
        if native:
            record.warnings.append(
                f"{label}: {direction.delay_s * 1e3:g} ms asked; the emulator's own path takes {path * 1e6:.0f} us one "
                "way, so this direction has no hold on the delay line (native path); verify shows what it delivers")
        elif direction.delay_s < path + WAKEUP_FLOOR_S:
            record.warnings.append(
                f"{label}: {direction.delay_s * 1e3:g} ms asked, below what the delay line delivers here "
                f"(~{(path + WAKEUP_FLOOR_S) * 1e3:.2f} ms: path {path * 1e6:.0f} us + daemon wake-up); "
                "verify shows the real figure; netem (a stock kernel) goes lower")

    def _hold_again(self, direction: LinkDirection) -> None:
        """A native-path direction back on the delay line (the delivery counter restarts first: it may only
        under-count)."""
        line = self._line(direction.dst_node)
        line.delete(delivered_rule(direction.dst_ifname))
        line.add(delivered_rule(direction.dst_ifname))
        line.add(hold_rule(direction.dst_ifname))
        self.record.native.remove(direction.label)

    def _configure(self, node: str, queues: list[QueueConfig], timing: Timing | None = None) -> None:
        """A new generation of the node's configuration, taken by its daemon before this returns."""
        self._write_config(Path(self.record.daemons[node].config), queues, timing)
        self._reload(node)

    _write_config = staticmethod(write_config)

    def _reload(self, node: str) -> None:
        """The node's daemon takes its configuration file's generation (its supervisor passes SIGHUP on)."""
        daemon = self._daemon(node)
        if daemon is None or not daemon.alive():
            raise ShaperError(f"delay daemon on {node} is not running", hint="'testbed verify' shows why")
        self._line(node).reload(daemon.pid)

    # -- run-time change --------------------------------------------------------------------------
    def set_direction(self, direction: LinkDirection) -> None:
        with self.backend.netlink(direction.src_node) as ipr:
            htb.change_rate(ipr, direction.src_ifname, direction.rate_bps)
        line = self._line(direction.dst_node)
        new = queue_config(direction, self.record.calibration_s)
        self._configure(direction.dst_node, [new if q.queue == new.queue else q for q in line.config().queues])
        self._place_hold(direction)
        self.backend.state.save()

    def _daemon(self, node: str) -> ProcessRecord | None:
        """The node's delay-line supervisor (the daemon's parent: signals to it reach the daemon)."""
        return next((p for p in self.backend.state.processes if p.role == ROLE and p.node == node), None)

    def supervisor_status(self, node: str) -> SupervisorStatus | None:
        return self._line(node).supervisor() if node in self.record.daemons else None

    def restarts(self) -> dict[str, int]:
        """Per receiving router: how often its daemon died and was started again."""
        return {node: status.restarts for node in self.record.daemons
                if (status := self.supervisor_status(node)) is not None}

    # -- inspection -------------------------------------------------------------------------------
    def daemon_stats(self, node: str) -> DaemonStats | None:
        """The daemon's own statistics file (written by `testbed.shaping.delayline`), None while it has none."""
        return self._line(node).stats() if node in self.record.daemons else None

    def edge_counters(self) -> dict[str, EdgeCounters]:
        """Per direction with an OTN edge (label): its pauses, pause time, buffer peak and drops so far."""
        out = {}
        for d in self.directions:
            stats = self.daemon_stats(d.dst_node) if d.edge is not None else None
            queue = stats.queues.get(queue_number(d.dst_ifname)) if stats else None
            if queue is not None and queue.edge is not None:
                out[d.label] = EdgeCounters(**queue.edge)
        return out

    def hold_counters(self) -> dict[str, tuple[int, float]]:
        """Per direction (label): packets released so far and the sum of their release error (seconds, signed:
        release time less due time), from the daemons' statistics; differences over a run, less the mean
        error while calibrating (`release_error_s`, which the calibration absorbed), give the error of the
        delay the link delivered under the run's load."""
        out = {}
        for d in self.directions:
            if d.label in self.record.native or d.dst_node not in self.record.daemons:
                continue
            holds = self._line(d.dst_node).holds(queue_number(d.dst_ifname))
            if holds is not None:
                out[d.label] = holds
        return out

    def health(self) -> Health:
        report = Health()
        report.problems += self.qdisc_problems()
        daemons = self.record.daemons
        for node, files in daemons.items():
            record = self._daemon(node)
            if record is None or not record.alive():
                report.problems.append(f"delay daemon on {node} is dead: packets into {node} over OTN are dropped "
                                       f"(no listener); see {files.log}")
                continue
            supervised = self.supervisor_status(node)
            if supervised and supervised.deaths:
                last = supervised.deaths[-1]
                report.events.append(f"delay daemon on {node} died {len(supervised.deaths)} time(s) and was "
                                     f"restarted {supervised.restarts} (last: {last.how}, link without a listener "
                                     f"for {last.gap_s * 1e3:.0f} ms); 'verify' shows the packets lost")
            stats_path = Path(files.stats)
            if stats_path.exists() and time.time() - stats_path.stat().st_mtime > STATS_STALE_S:
                report.problems.append(f"delay daemon on {node} stopped reporting (stats older than {STATS_STALE_S} s)")
        rules = self._installed_rules()
        for d in self.directions:
            if d.label in self.record.native:
                continue
            want = hold_rule(d.dst_ifname).spec
            if want not in rules.get(d.dst_node, ""):
                report.problems.append(f"{d.label}: NFQUEUE rule missing on {d.dst_node} ({want})")
        report.details["daemons"] = {node: self.daemon_stats(node) for node in daemons}
        return report

    def _installed_rules(self, table: str = "raw", counters: bool = False) -> dict[str, str]:
        return {node: listing(self._place(node), table, counters) for node in {d.dst_node for d in self.directions}}

    def drops(self) -> list[DirectionDrops]:
        result = []
        entered, delivered = self._installed_rules("raw", True), self._installed_rules("mangle", True)
        kernel = {node: queue_counters(self._place(node)) for node in {d.dst_node for d in self.directions}}
        for d in self.directions:
            qnum = queue_number(d.dst_ifname)
            q = kernel[d.dst_node].get(qnum)
            daemon = self.daemon_stats(d.dst_node)
            stats = daemon.queues.get(qnum) if daemon else None
            queue_drops = (q.dropped + q.user_dropped) if q else 0
            gaps, random_drops = (stats.id_gaps, stats.random_drops) if stats else (0, 0)
            edge = (stats.edge if stats else None) or {}
            lossless_edge = edge.get("drops", 0) if d.edge is not None and d.edge.mode == "pfc" else 0
            buffer_drops = edge.get("drops", 0) + edge.get("lossy_drops", 0) - lossless_edge
            went_in = rule_packets(entered.get(d.dst_node, ""), d.dst_ifname, "NFQUEUE")
            came_out = rule_packets(delivered.get(d.dst_node, ""), d.dst_ifname, DELIVERED_COMMENT)
            lost = 0
            if went_in is not None and came_out is not None:
                held = stats.held if stats else 0
                lost = max(0, went_in - came_out - held - random_drops - queue_drops - gaps - buffer_drops
                           - lossless_edge)
            result.append(DirectionDrops(
                link=d.link, direction=d.label, qdisc_drops=self.qdisc_drops(d), queue_drops=queue_drops,
                daemon_gaps=gaps, random_drops=random_drops, lost_without_listener=lost, buffer_drops=buffer_drops,
                edge_lossless_drops=lossless_edge))
        return result
