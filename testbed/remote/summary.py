"""The run summary of a run across machines: the single machine's RunSummary, with what several machines
change (verify's round trips instead of one-way readings, the placement's machines, oversubscription counted
per boot id)."""

from __future__ import annotations

from typing import Any

from testbed.check.checks import Check
from testbed.remote.fleet import Fleet
from testbed.remote.hostshape import HostShape
from testbed.remote.inventory import Machine
from testbed.remote.verify import dc_pair
from testbed.run.runner import RunOptions, compute_fields, describe_transport
from testbed.run.summary import LinkRecord, RunSummary, ScheduleSummary, StageLink, StagePlacement
from testbed.run.transport import TransportChoice
from testbed.shaping.registry import runs_daemons
from workloads.records import RankTrace

Pair = tuple[str, str]


def remote_summary(fleet: Fleet, run_id: str, plan: Any, chosen: list[Machine], links: list[StageLink],
                   summaries: list[ScheduleSummary], options: RunOptions, checks: list[Check],
                   shapes: dict[str, HostShape], drops_before: dict[Pair, int], drops_after: dict[Pair, int],
                   transport: TransportChoice, traces: dict[str, list[RankTrace]]) -> RunSummary:
    rtt = {c.key: c for c in checks if c.kind == "rtt"}
    records = []
    for d in plan.directions:
        check = rtt.get(dc_pair(d.src_dc, d.dst_dc))
        key = (d.src_dc, d.dst_dc)
        records.append(LinkRecord(
            link=d.link, src_dc=d.src_dc, dst_dc=d.dst_dc, configured_delay_s=d.delay_s, configured_rate_bps=d.rate_bps,
            measured_one_way=f"round trip {check.measured}" if check else None,   # one way: not across machines
            delay_ok=check.ok if check else None,
            drops_during_run=drops_after[key] - drops_before.get(key, 0) if key in drops_after else None,
            lossless=d.lossless))
    facts = fleet.facts
    boots: dict[str, list[str]] = {}
    for m in chosen:
        boots.setdefault(facts[m.name].env.boot_id or m.name, []).append(m.name)
    daemons = sum(1 for m in chosen if runs_daemons(facts[m.name].shaper))
    cpus = min(facts[m.name].env.cpus or 1 for m in chosen)
    busiest = max(len(names) for names in boots.values())
    oversubscribed = busiest + (daemons if busiest > 1 else min(1, daemons)) > cpus
    shapers = sorted({facts[m.name].shaper or "none" for m in chosen})
    calibration = {f"{dc} -> {fleet.inventory.machine(name).dc}": s for name, shape in shapes.items()
                   for dc, s in shape.subtract_s.items()}
    return RunSummary(
        run_id=run_id, topology=plan.topology, testbed=fleet.testbed,
        stages=[StagePlacement(i, m.name, m.dc) for i, m in enumerate(chosen)], stage_links=links,
        links=records, lossless_ok=all(not lk.lossless or not lk.drops_during_run for lk in records),
        shaper="+".join(shapers), backend="remote-ssh", switch=None, shaper_calibration_s=calibration,
        transport=describe_transport(transport, traces), transport_reason=transport.reason,
        transport_detail={s: [r.transport_detail for r in ranks] for s, ranks in traces.items() if transport.devices},
        kernel=", ".join(sorted({facts[m.name].kernel for m in chosen})), cpus=cpus,
        oversubscribed=oversubscribed, workers=len(chosen), delay_daemons=daemons,
        options=options.to_json(), schedules=summaries, daemon_restarts=0, **compute_fields(options, traces))
