"""TCP's own counters in a node's network namespace (/proc/net/snmp and /proc/net/netstat), for a run's record:
segments sent again, and of those the tail-loss probes (sent after two round trips of silence, not on a loss)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

from testbed.backends.base import Backend, BackendError


@dataclass(frozen=True, slots=True)
class TcpCounters:
    """A namespace's TCP counters since it was made (or their difference over a run)."""

    retransmits: int
    """RetransSegs: every segment sent again (a loss's, a timeout's, or a probe's)."""
    loss_probes: int = 0
    """TCPLossProbes: tail-loss probes (RFC 8985), a retransmission TCP sends when a flight's ACK is two round trips
    late, lost or not (a pause that holds a flight triggers them)."""
    timeouts: int = 0
    """TCPTimeouts: retransmission timeouts (at least 200 ms of silence each)."""

    def minus(self, other: TcpCounters) -> TcpCounters:
        return TcpCounters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_counters(backend: Backend, node: str) -> TcpCounters | None:
    """The node's TCP counters; None where they cannot be read (the node gone, or the read hung)."""
    try:
        result = backend.exec(node, ["cat", "/proc/net/snmp", "/proc/net/netstat"], capture_output=True, text=True,
                              timeout=10)
    except (BackendError, OSError, subprocess.TimeoutExpired):
        return None
    return parse_counters(result.stdout) if result.returncode == 0 else None


def parse_counters(text: str) -> TcpCounters | None:
    """From /proc/net/snmp + /proc/net/netstat text: each group is a header line and a values line with one prefix."""
    values: dict[str, int] = {}
    for prefix in ("Tcp:", "TcpExt:"):
        rows = [line.split()[1:] for line in text.splitlines() if line.startswith(prefix)]
        if len(rows) >= 2:
            values.update({f"{prefix}{k}": int(v) for k, v in zip(rows[0], rows[1], strict=False)})
    if "Tcp:RetransSegs" not in values:
        return None
    return TcpCounters(values["Tcp:RetransSegs"], values.get("TcpExt:TCPLossProbes", 0),
                       values.get("TcpExt:TCPTimeouts", 0))


def counters_by_node(backend: Backend, nodes: Iterable[str]) -> dict[str, TcpCounters | None]:
    return {node: read_counters(backend, node) for node in nodes}


def counters_during(before: dict[str, TcpCounters | None],
                    after: dict[str, TcpCounters | None]) -> dict[str, dict[str, int] | None]:
    """Per node, the counters' growth between two readings, as JSON (None where either is missing)."""
    out: dict[str, dict[str, int] | None] = {}
    for node, end in after.items():
        start = before.get(node)
        out[node] = None if end is None or start is None else end.minus(start).to_json()
    return out
