"""The `delayline` shaper, for kernels without netem: rate by HTB on the sender's OTN egress, delay by an
NFQUEUE verdict daemon on the receiver's ingress (iptables raw PREROUTING), one daemon per receiving router.

Queueing on the receiver's ingress (not the sender's egress) keeps TCP Small Queues from throttling the
sender; the rule has no --queue-bypass, so a dead daemon stops the link's traffic (loud) instead of
letting it through undelayed (silent).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from testbed.backends import nsfs
from testbed.plan.model import LinkShape, Plan
from testbed.shaping import htb, nfqueue
from testbed.shaping.base import DirectionDrops, Health, Shaper, ShaperError, direction_label, field_of
from testbed.shaping.calibrate import CALIBRATION_HOLD_S, base_one_way
from testbed.state import ProcessRecord, process_start_ticks

READY_TIMEOUT_S = 60.0
WAKEUP_FLOOR_S = 150e-6
"""A hold shorter than this cannot be timed: the daemon needs ~0.1-0.2 ms to wake on a packet's arrival."""
STATS_STALE_S = 3.0


def queue_number(ifname: str) -> int:
    """Queue number of an OTN interface: `otn3` -> 3 (unique within the receiving namespace)."""
    return int(ifname.removeprefix("otn"))


def iptables_rule(ifname: str, action: str = "-A") -> list[str]:
    """The NFQUEUE rule of one incoming OTN interface (`-A` to add it, `-D` to delete it)."""
    return ["-t", "raw", action, "PREROUTING", "-i", ifname, "-j", "NFQUEUE", "--queue-num", str(queue_number(ifname))]


class DelaylineShaper(Shaper):
    name = "delayline"

    # -- files of this testbed's daemons ---------------------------------------------------------
    def _dir(self) -> Path:
        path = self.backend.state.files_dir
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _files(self, node: str) -> tuple[Path, Path, Path]:
        d = self._dir()
        return d / f"delayline-{node}.json", d / f"delayline-{node}.stats.json", d / f"delayline-{node}.log"

    # -- apply ------------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        if not _iptables():
            raise ShaperError("the delayline shaper needs iptables with the NFQUEUE target (apt-get install iptables)")
        for shape in plan.shapes:
            with self.backend.netlink(shape.src_node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(shape.src_node, shape.src_ifname, shape.rate_bps,
                                                 shape.rate_queue_packets))
        self.apply_fabric(plan)
        extra: dict[str, Any] = {"name": self.name, "calibration_s": {}, "daemons": {}}
        self.backend.state.extra["shaper"] = extra
        incoming: dict[str, list[LinkShape]] = defaultdict(list)
        for shape in plan.shapes:
            incoming[shape.dst_node].append(shape)
        hold = {direction_label(s): s.delay_s - CALIBRATION_HOLD_S for s in plan.shapes}
        for node, shapes in incoming.items():
            config, stats, log = self._files(node)
            self._write_config(config, [self._queue_config(s, hold) for s in shapes], generation=0)
            stats.unlink(missing_ok=True)
            self._start_daemon(node, config, stats, log)
            extra["daemons"][node] = {"config": str(config), "stats": str(stats), "log": str(log)}
            self.backend.state.save()
            for shape in shapes:
                self._iptables(node, iptables_rule(shape.dst_ifname))
        calibration = base_one_way(self.backend, installed_hold_s=CALIBRATION_HOLD_S)
        extra["calibration_s"] = calibration
        extra["native"] = []
        extra["warnings"] = []
        for s in plan.shapes:
            self._place_stage(s)
        self.backend.state.save()
        for node, shapes in incoming.items():
            config = Path(extra["daemons"][node]["config"])
            self._write_config(config, [self._queue_config(s, calibration) for s in shapes], generation=1)
            self._reload(node, generation=1)

    def _place_stage(self, shape: LinkShape) -> None:
        """Delay stage or native path for one direction, with a warning that names what was done.

        A hold shorter than the daemon's wake-up cannot be timed; when the asked delay is nearer the emulator's
        own path latency than the shortest hold plus that latency, the direction gets no delay stage and its
        path itself delivers the delay ('native path'); verify measures it like any other."""
        extra = self.backend.state.extra["shaper"]
        label = direction_label(shape)
        path = extra["calibration_s"][label]
        native = shape.delay_s < path + WAKEUP_FLOOR_S / 2
        was_native = label in extra["native"]
        if native and not was_native:
            self._iptables(shape.dst_node, iptables_rule(shape.dst_ifname, "-D"))
            extra["native"].append(label)
        elif was_native and not native:
            self._iptables(shape.dst_node, iptables_rule(shape.dst_ifname))
            extra["native"].remove(label)
        extra["warnings"] = [w for w in extra["warnings"] if not w.startswith(label + ":")]
        if native:
            extra["warnings"].append(
                f"{label}: {shape.delay_s * 1e3:g} ms asked; the emulator's own path takes {path * 1e6:.0f} us one "
                "way, so this direction has no delay stage (native path); verify shows what it delivers")
        elif shape.delay_s < path + WAKEUP_FLOOR_S:
            extra["warnings"].append(
                f"{label}: {shape.delay_s * 1e3:g} ms asked, below what the delay line delivers here "
                f"(~{(path + WAKEUP_FLOOR_S) * 1e3:.2f} ms: path {path * 1e6:.0f} us + daemon wake-up); "
                "verify shows the real figure; netem (a stock kernel) goes lower")

    @staticmethod
    def _write_config(path: Path, queues: list[dict[str, Any]], generation: int) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"generation": generation, "queues": queues}, indent=1))
        os.replace(tmp, path)

    def _reload(self, node: str, generation: int) -> None:
        """SIGHUP the node's daemon and wait until it reports the new config generation."""
        daemon = self._daemon(node)
        if daemon is None or not daemon.alive():
            raise ShaperError(f"delay daemon on {node} is not running; 'testbed verify' shows why")
        os.kill(daemon.pid, signal.SIGHUP)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            stats = self.daemon_stats(node)
            if stats and stats.get("generation", -1) >= generation:
                return
            time.sleep(0.005)
        raise ShaperError(f"delay daemon on {node} did not take its new configuration")

    @staticmethod
    def _queue_config(shape: LinkShape | dict[str, Any], subtract: dict[str, float]) -> dict[str, Any]:
        """Daemon config of one direction: hold for the planned delay minus `subtract[direction]`."""
        def get(key: str) -> Any:
            return field_of(shape, key)

        base = subtract.get(direction_label(shape), 0.0)
        return {"queue": queue_number(get("dst_ifname")), "ifname": get("dst_ifname"),
                "delay_s": max(0.0, get("delay_s") - base), "jitter_s": get("jitter_s"), "loss": get("loss"),
                "maxlen": get("delay_queue_packets")}

    def _start_daemon(self, node: str, config: Path, stats: Path, log: Path) -> None:
        with open(log, "ab") as logf:
            proc = self.backend.popen(node, [sys.executable, "-m", "testbed.shaping.delayline", str(config), str(stats)],
                                      stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env={**os.environ, "PYTHONPATH": _package_root()})
        ticks = process_start_ticks(proc.pid) or 0
        self.backend.state.processes.append(ProcessRecord(proc.pid, ticks, "delayline", node))
        self.backend.state.save()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ShaperError(f"delay daemon on {node} exited with {proc.returncode}: "
                                  f"{log.read_text()[-800:].strip()}")
            if stats.exists():
                return
            time.sleep(0.01)
        raise ShaperError(f"delay daemon on {node} did not become ready in {READY_TIMEOUT_S:.0f} s; log: {log}")

    def _iptables(self, node: str, rule: list[str]) -> None:
        result = self.backend.exec(node, [_iptables() or "iptables", "-w", *rule], capture_output=True, text=True)
        if result.returncode != 0:
            raise ShaperError(f"iptables on {node} refused {' '.join(rule)}: {result.stderr.strip()}")

    # -- run-time change --------------------------------------------------------------------------
    def set_direction(self, shape: LinkShape) -> None:
        with self.backend.netlink(shape.src_node) as ipr:
            htb.change_rate(ipr, shape.src_ifname, shape.rate_bps)
        extra = self.backend.state.extra["shaper"]
        config_path = Path(extra["daemons"][shape.dst_node]["config"])
        config = json.loads(config_path.read_text())
        new = self._queue_config(shape, extra["calibration_s"])
        queues = [new if q["queue"] == new["queue"] else q for q in config["queues"]]
        generation = int(config.get("generation", 0)) + 1
        self._write_config(config_path, queues, generation)
        self._reload(shape.dst_node, generation)
        self._place_stage(shape)
        self.backend.state.save()

    def _daemon(self, node: str) -> ProcessRecord | None:
        return next((p for p in self.backend.state.processes if p.role == "delayline" and p.node == node), None)

    # -- inspection -------------------------------------------------------------------------------
    def daemon_stats(self, node: str) -> dict[str, Any] | None:
        info = self.backend.state.extra.get("shaper", {}).get("daemons", {}).get(node)
        if not info:
            return None
        try:
            return dict(json.loads(Path(info["stats"]).read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def health(self) -> Health:
        report = Health()
        report.problems += self.qdisc_problems()
        daemons = self.backend.state.extra.get("shaper", {}).get("daemons", {})
        for node, info in daemons.items():
            record = self._daemon(node)
            if record is None or not record.alive():
                report.problems.append(f"delay daemon on {node} is dead: packets into {node} over OTN are dropped "
                                       f"(no listener); see {info['log']}")
                continue
            stats_path = Path(info["stats"])
            if stats_path.exists() and time.time() - stats_path.stat().st_mtime > STATS_STALE_S:
                report.problems.append(f"delay daemon on {node} stopped reporting (stats older than {STATS_STALE_S} s)")
        rules = self._installed_rules()
        native = self.backend.state.extra.get("shaper", {}).get("native", [])
        for shape in self.backend.state.plan.get("shapes", []):
            if direction_label(shape) in native:
                continue
            want = " ".join(iptables_rule(shape["dst_ifname"])[2:])
            if want not in rules.get(shape["dst_node"], ""):
                report.problems.append(f"{direction_label(shape)}: NFQUEUE rule missing on {shape['dst_node']} "
                                       f"({want})")
        report.details["daemons"] = {node: self.daemon_stats(node) for node in daemons}
        return report

    def _installed_rules(self) -> dict[str, str]:
        rules = {}
        for node in {s["dst_node"] for s in self.backend.state.plan.get("shapes", [])}:
            out = self.backend.exec(node, [_iptables() or "iptables", "-w", "-t", "raw", "-S", "PREROUTING"],
                                    capture_output=True, text=True)
            rules[node] = out.stdout
        return rules

    def drops(self) -> list[DirectionDrops]:
        result = []
        counters: dict[str, dict[int, nfqueue.QueueCounters]] = {}
        for shape in self.backend.state.plan.get("shapes", []):
            node = shape["dst_node"]
            if node not in counters:
                with nsfs.entered(self.backend.netns_path(node)):
                    try:
                        text = Path("/proc/thread-self/net/netfilter/nfnetlink_queue").read_text()
                    except FileNotFoundError:
                        text = ""
                counters[node] = nfqueue.parse_proc(text)
            qnum = queue_number(shape["dst_ifname"])
            q = counters[node].get(qnum)
            stats = (self.daemon_stats(node) or {}).get("queues", {}).get(str(qnum), {})
            result.append(DirectionDrops(
                link=shape["link"], direction=direction_label(shape), qdisc_drops=self.qdisc_drops(shape),
                queue_drops=(q.dropped + q.user_dropped) if q else 0,
                daemon_gaps=int(stats.get("id_gaps", 0)), random_drops=int(stats.get("random_drops", 0))))
        return result


def _iptables() -> str | None:
    import shutil

    return shutil.which("iptables")


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)
