"""The plan as terminal tables (`testbed plan`)."""

from __future__ import annotations

from testbed.plan.model import Plan
from testbed.util import table, units


def render_plan(plan: Plan) -> str:
    out = [f"testbed {plan.testbed}  (topology {plan.topology}, {plan.source})"]
    rows = [(n.name, n.dc, n.role, n.netns, " ".join(n.addresses)) for n in plan.nodes]
    out.append(table.render(["node", "dc", "role", "netns", "addresses"], rows, "\nNodes"))
    rows = [(d.link, d.label, units.format_time(d.delay_s), units.format_rate(d.rate_bps), units.format_time(d.jitter_s),
             f"{d.loss:g}", "yes" if d.lossless else "no", d.mtu, units.format_size(d.bdp_bytes), d.rate_queue_packets,
             d.delay_queue_packets) for d in plan.directions]
    out.append(table.render(["link", "direction", "delay", "rate", "jitter", "loss", "lossless", "mtu", "BDP(rtt)",
                             "rate q (pkts)", "delay q (pkts)"], rows, "\nOTN links (one row per direction)"))
    rows = [(n.name, str(r.dst), str(r.gateway), r.dev, str(r.src or "-")) for n in plan.routers for r in n.routes]
    out.append(table.render(["router", "destination", "via", "dev", "src"], rows, "\nRoutes (shortest one-way delay)"))
    rows = [(src, dst, " > ".join(p)) for src, by in plan.paths.items() for dst, p in by.items() if src != dst]
    out.append(table.render(["from", "to", "path"], rows, "\nDC paths"))
    out.append(f"\nTCP buffers (tcp_rmem/tcp_wmem max on hosts): {units.format_size(plan.tcp_buffer_bytes)} "
               "(2 x the largest path bandwidth-delay product, at least 6 MiB)")
    out += [f"scale: {note}" for note in plan.notes]
    return "\n".join(out)
