"""The plan as terminal tables (`testbed plan`)."""

from __future__ import annotations

from testbed.plan.model import LinkDirection, Plan
from testbed.util import table, units


def render_plan(plan: Plan) -> str:
    out = [f"testbed {plan.testbed}  (topology {plan.topology}, {plan.source})"]
    rows = [(n.name, n.dc, n.role, n.netns, " ".join(n.addresses)) for n in plan.nodes]
    out.append(table.render(["node", "dc", "role", "netns", "addresses"], rows, "\nNodes"))
    rows = [(d.link, d.label, units.format_time(d.delay_s), units.format_rate(d.rate_bps), units.format_time(d.jitter_s),
             f"{d.loss:g}", lossless_name(d), d.mtu, units.format_size(d.bdp_bytes), d.rate_queue_packets,
             d.delay_queue_packets) for d in plan.directions]
    out.append(table.render(["link", "direction", "delay", "rate", "jitter", "loss", "lossless", "mtu", "BDP(rtt)",
                             "rate q (pkts)", "delay q (pkts)"], rows, "\nOTN links (one row per direction)"))
    edges = [d for d in plan.directions if d.edge is not None]
    if edges:
        out.append(render_edges(edges))
    if plan.background:
        out.append(render_background(plan))
    rows = [(n.name, str(r.dst), str(r.gateway), r.dev, str(r.src or "-")) for n in plan.routers for r in n.routes]
    out.append(table.render(["router", "destination", "via", "dev", "src"], rows, "\nRoutes (shortest one-way delay)"))
    rows = [(src, dst, " > ".join(p)) for src, by in plan.paths.items() for dst, p in by.items() if src != dst]
    out.append(table.render(["from", "to", "path"], rows, "\nDC paths"))
    out.append(f"\nTCP buffers (tcp_rmem/tcp_wmem max on hosts): {units.format_size(plan.tcp_buffer_bytes)} "
               "(2 x the largest path bandwidth-delay product, at least 6 MiB)")
    out += [f"scale: {note}" for note in plan.notes]
    return "\n".join(out)


def lossless_name(d: LinkDirection) -> str:
    """How a direction is lossless: `pfc` (buffer and pause), `queue` (a deep queue), or `no`."""
    if d.edge is not None and d.edge.mode == "pfc":
        return "pfc"
    return "queue" if d.lossless else "no"


def render_edges(directions: list[LinkDirection]) -> str:
    """The OTN edges: buffer, PFC thresholds and the headroom they must leave (what still arrives after PAUSE)."""
    rows = []
    for d in directions:
        e = d.edge
        assert e is not None
        pfc = e.mode == "pfc"
        rows.append((d.link, d.label, e.mode, units.format_size(e.buffer_bytes) if e.buffer_bytes else "deep",
                     units.format_size(e.xoff_bytes) if pfc else "-", units.format_size(e.xon_bytes) if pfc else "-",
                     units.format_size(e.headroom_bytes), units.format_time(e.pause_delay_s) if pfc else "-",
                     units.format_rate(e.drain_rate_bps)))
    return table.render(["link", "direction", "edge", "buffer", "XOFF", "XON", "headroom", "pause takes", "DC-side rate"],
                        rows, "\nOTN edges (headroom: (both delays + response) x rate + two 64 KiB units; "
                        "testbed/topology/edge.py)")


def render_background(plan: Plan) -> str:
    """The background loads: who sends to whom, how many flows at what rate, in which class, over which links."""
    rows = []
    for load in plan.background:
        src, dst = plan.node(load.src).dc, plan.node(load.dst).dc
        rows.append((load.src, load.dst, load.flows, units.format_rate(load.rate_bps) if load.rate_bps else "unpaced",
                     "lossy (CS1)" if load.lossy else "lossless", ", ".join(d.label for d in plan.hops(src, dst))))
    return table.render(["from", "to", "flows", "rate", "class", "crosses"], rows,
                        "\nBackground traffic (started and stopped with each run; testbed/run/background.py)")
