"""A run's summary.json, typed: per schedule (`ScheduleSummary`, docs/json-contracts.md) and for the run
(`RunSummary`: topology, links configured and measured, shaper, transport, kernel, host load), with
`to_json`/`from_json` and the terminal table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from testbed.run.breakdown import Breakdown
from testbed.run.dilation import OFF, Dilation
from testbed.run.lateness import LATE_FLOOR_S, LATE_P99_FRACTION, SpanLateness
from testbed.util import table, units
from testbed.util.hostload import COMPUTE_SLOWDOWN_FLAG, HOST_DRIFT_BOUND, HostLoad
from workloads.schedule import GeoPipeSizing

STRETCH_FLAG = 1.05
"""A schedule whose own F/B spans took more than this multiple of the uncontended reference is flagged: its
own-span bubble ratio is flattered by the stretch (judge it by step time or the bubble vs the reference)."""


@dataclass(frozen=True, slots=True)
class LinkTiming:
    """One delay-line direction during one schedule's run (cf. Mininet-HiFi's invariant monitoring): the
    mean error of the hold it delivered under the run's load, from the daemon's own release times."""

    direction: str
    configured_delay_s: float
    packets: int
    mean_error_s: float
    """Mean over the run's packets of release time - due time (positive: the link was slower than asked)."""
    tolerance_s: float
    """max(3 % of the delay, 0.1 ms): verify's one-way tolerance."""
    baseline_error_s: float = 0.0
    """The daemon's mean release error outside the run, already taken off `mean_error_s`: one machine's while it
    calibrated (the hold absorbs it), several machines' over a round of pings just before the run."""

    @property
    def ok(self) -> bool:
        return abs(self.mean_error_s) <= self.tolerance_s

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkTiming:
        return cls(**{k: v for k, v in data.items() if k != "ok"})


@dataclass(kw_only=True, slots=True)
class ScheduleSummary:
    """One schedule's figures over the steady-state iterations (warm-up excluded)."""

    schedule: str
    bubble_ratio: float | None
    """Mean over stages of each stage's median 1 - compute/step time; None where not instrumented (torch-*)."""
    bubble_ratio_per_stage: list[float] | None
    step_time_s: float
    """Median over steady iterations."""
    step_time_spread_s: list[float]
    """[min, max] over steady iterations."""
    tokens_per_s: float
    bubble_ratio_iterations: list[list[float]] | None
    """Per stage, every steady iteration's bubble ratio."""
    exposed_comm_s: float | None
    exposed_comm_s_per_stage: list[float] | None
    compute_s_per_stage: list[float] | None
    peak_inflight_activation_bytes: int | None
    peak_inflight_activation_bytes_per_stage: list[int] | None
    loss_first: float | None
    loss_last: float | None
    iterations: int
    geopipe_sizing: GeoPipeSizing | None = None
    reference_compute_s_per_stage: list[float] | None = None
    """Per stage (rank): its F+B of one step's micro-batches with no communication (the mean of the measurements
    before and after the run's iterations)."""
    bubble_vs_reference: float | None = None
    """Mean over stages of 1 - yardstick / step time: the bubble no stretched span can hide (the headline's)."""
    bubble_vs_reference_per_stage: list[float] | None = None
    reference_yardstick_s_per_stage: list[float] | None = None
    """The reference `bubble_vs_reference` is taken against: the one measured in the same launch for this stage
    layout, shared by every schedule interleaved in it (the host's speed drifts by 10-30 % over minutes on the
    project's machines: a yardstick from another run would move the bubble by as much)."""
    reference_pooled_runs: int = 1
    """How many schedules share the yardstick."""
    span_stretch_per_stage: list[float] | None = None
    """Per stage: own F+B spans over the reference (1.0: as fast as alone; flagged above STRETCH_FLAG)."""
    budget_bytes_per_stage: list[int] | None = None
    """The in-flight budget each stage ran under (enforced by the workers), None for none."""
    budget_ok: bool = True
    """Every stage's measured in-flight peak stayed within its budget."""
    host_load: HostLoad | None = None
    repeated: int = 0
    """Times this run was measured again because the host was disturbed (hostload.STEAL_BOUND) or, with compute as
    time, its spans were late (testbed/run/lateness.py)."""
    breakdown: Breakdown | None = None
    """Where the step went per stage and who used the CPU (testbed/run/breakdown.py); None for torch-*."""
    link_timing: list[LinkTiming] = field(default_factory=list)
    """Per delay-line direction that carried packets: the hold it delivered during this run (empty on netem)."""
    link_setting: str | None = None
    """In a run that sweeps a link (the experiment's distance sweep), the point this schedule ran at; its
    traces are in <label>/<schedule>/."""
    span_lateness_per_stage: list[SpanLateness] | None = None
    """Compute as time, per stage: how late its F/B spans really ended (testbed/run/lateness.py); None for real
    compute and summaries of releases before it."""

    @property
    def links_on_time(self) -> bool:
        """Every delay-line direction delivered its delay within tolerance during the run."""
        return all(t.ok for t in self.link_timing)

    @property
    def lateness_ok(self) -> bool:
        """Every stage's timed spans' p99 lateness was within its bound (true where nothing is timed)."""
        return all(x.ok for x in self.span_lateness_per_stage or [])

    def late_spans(self) -> list[str]:
        """Per stage beyond the lateness bound, why (empty: on time)."""
        name = f"{self.link_setting}/{self.schedule}" if self.link_setting else self.schedule
        return [f"{name} stage {s}: {x.describe()}" for s, x in enumerate(self.span_lateness_per_stage or [])
                if not x.ok]

    @property
    def stretched(self) -> bool:
        return any(x > STRETCH_FLAG for x in self.span_stretch_per_stage or [])

    def to_json(self) -> dict[str, Any]:
        late = self.span_lateness_per_stage
        return {**asdict(self), "stretched": self.stretched,
                "breakdown": self.breakdown.to_json() if self.breakdown else None,
                "host_load": self.host_load.to_json() if self.host_load else None,
                "link_timing": [t.to_json() for t in self.link_timing], "links_on_time": self.links_on_time,
                "span_lateness_per_stage": None if late is None else [x.to_json() for x in late],
                "lateness_ok": self.lateness_ok}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScheduleSummary:
        """Also reads summaries of 0.1 (`geo_plan`)."""
        known = {f.name for f in fields(cls)} - {"geopipe_sizing", "host_load", "breakdown", "link_timing",
                                                 "span_lateness_per_stage"}
        sizing = data.get("geopipe_sizing", data.get("geo_plan"))
        load = data.get("host_load")
        split = data.get("breakdown")
        late = data.get("span_lateness_per_stage")
        return cls(**{k: v for k, v in data.items() if k in known},
                   geopipe_sizing=GeoPipeSizing.from_json(sizing) if sizing else None,
                   host_load=HostLoad.from_json(load) if load else None,
                   breakdown=Breakdown.from_json(split) if split else None,
                   link_timing=[LinkTiming.from_json(t) for t in data.get("link_timing", [])],
                   span_lateness_per_stage=None if late is None else [SpanLateness.from_json(x) for x in late])


@dataclass(frozen=True, slots=True)
class StageLink:
    """What lies between stage s and s+1: configured one-way delay and bottleneck rate (0 delay within a DC)."""

    delay_s: float
    rate_bps: float
    real_rate_bps: float | None = None
    """The deployment's rate at the bottleneck (the topology's `real_rate`); None within a DC or where unstated."""
    crosses_dc: bool = True
    """False between two stages of one DC (its fabric)."""


@dataclass(frozen=True, slots=True)
class StagePlacement:
    rank: int
    host: str
    dc: str


@dataclass(frozen=True, slots=True)
class LinkRecord:
    """One OTN direction during the run: configured, measured before it, drops during it.
    `from`/`to` in its JSON repeat `src_dc`/`dst_dc` (deprecated: the 0.1 names)."""

    link: str
    src_dc: str
    dst_dc: str
    configured_delay_s: float
    configured_rate_bps: float
    measured_one_way: str | None
    delay_ok: bool | None
    drops_during_run: int | None
    lossless: bool
    measured_one_way_s: float | None = None
    """The one-way delay verify measured before the run (None where it was not measured per direction)."""
    edge: dict[str, Any] | None = None
    """The OTN edge during the run (testbed/run/edges.py): pauses, pause time, buffer peak, drops."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "from": self.src_dc, "to": self.dst_dc}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known},
                      "src_dc": data.get("src_dc", data.get("from")), "dst_dc": data.get("dst_dc", data.get("to"))})


@dataclass(kw_only=True, slots=True)
class RunSummary:
    """results/<run-id>/summary.json."""

    run_id: str
    topology: str
    testbed: str
    stages: list[StagePlacement]
    stage_links: list[StageLink]
    links: list[LinkRecord]
    lossless_ok: bool
    shaper: str
    backend: str
    switch: str | None
    shaper_calibration_s: dict[str, float]
    transport: str
    kernel: str
    cpus: int
    oversubscribed: bool
    workers: int
    delay_daemons: int
    options: dict[str, Any]
    """The run's options (RunOptions as JSON)."""
    schedules: list[ScheduleSummary] = field(default_factory=list)
    transport_reason: str = ""
    """Why this transport (`--transport auto` says why not RDMA)."""
    transport_detail: dict[str, Any] = field(default_factory=dict)
    """RDMA only: per schedule, per rank, the QPs, RDMA MTU, ACK timeout and slot pool to each neighbour."""
    daemon_restarts: int = 0
    """Delay daemons that died during the run and were started again (their lost packets are in `links`)."""
    dilation: Dilation = OFF
    """Time dilation of the run (k, the workers' caps, why); every time in the summary is undilated."""
    compute: str = "real"
    """Where the compute came from (`--compute`): real, replay, replay:FILE or a deployment profile's name."""
    compute_detail: str = ""
    """The cost table's own description (timed compute); empty for real compute."""
    arithmetic: bool = True
    """False where no arithmetic ran (compute as time): losses and gradients are then absent."""
    fb_per_microbatch_s: float | None = None
    """F+B of one micro-batch on the median stage: measured alone for real compute, the table's for timed."""
    background: list[dict[str, Any]] = field(default_factory=list)
    """The topology's background loads during the kept launch: bytes sent, seconds, TCP retransmits (iperf3's)."""
    tcp: dict[str, dict[str, int] | None] = field(default_factory=dict)
    """Per host, its namespace's TCP counters over the kept launch: retransmits, of those tail-loss probes, and
    timeouts (testbed/probe/tcpstats.py; None: unreadable)."""
    rate_scale: list[float] = field(default_factory=list)
    """Per stage link, the deployment's rate over the emulated one (timed compute from a profile); empty: 1."""

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "dilation": self.dilation.to_json(),
                "stages": [asdict(s) for s in self.stages], "stage_links": [asdict(s) for s in self.stage_links],
                "links": [lk.to_json() for lk in self.links], "schedules": [s.to_json() for s in self.schedules]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known},
                      "stages": [StagePlacement(**s) for s in data["stages"]],
                      "stage_links": [StageLink(**s) for s in data["stage_links"]],
                      "links": [LinkRecord.from_json(lk) for lk in data["links"]],
                      "schedules": [ScheduleSummary.from_json(s) for s in data["schedules"]],
                      "dilation": Dilation.from_json(data["dilation"]) if data.get("dilation") else OFF})

    def compute_line(self) -> str:
        """Where the compute came from and the F+B per micro-batch every timing here rests on."""
        fb = "" if self.fb_per_microbatch_s is None else f", F+B {self.fb_per_microbatch_s * 1e3:.1f} ms per micro-batch"
        scale = sorted({round(x, 3) for x in self.rate_scale})
        wire = "" if not scale or scale == [1.0] else ", messages at 1:" + "/".join(f"{x:g}" for x in scale)
        kind = "real compute" if self.arithmetic else f"compute as time ({self.compute}, no arithmetic)"
        return f"{kind}{fb}{wire}"

    def render(self) -> str:
        rows = []
        for s in self.schedules:
            br, ref = s.bubble_ratio, s.bubble_vs_reference
            stretch = max(s.span_stretch_per_stage) if s.span_stretch_per_stage else None
            load = s.host_load
            rows.append((f"{s.link_setting}/{s.schedule}" if s.link_setting else s.schedule,
                         "-" if ref is None else f"{ref:.3f}", "-" if br is None else f"{br:.3f}",
                         "-" if stretch is None else f"{stretch:.2f}" + (" !" if s.stretched else ""),
                         f"{s.step_time_s:.3f}", f"{s.tokens_per_s:.0f}",
                         "-" if s.peak_inflight_activation_bytes is None
                         else units.format_size(s.peak_inflight_activation_bytes),
                         "-" if not s.budget_bytes_per_stage else units.format_size(max(s.budget_bytes_per_stage)),
                         "-" if load is None else f"{load.steal_fraction:.0%} / "
                         + (f"{load.foreign_fraction:.0%}" if load.foreign_measured else "n/m")
                         + (" !" if load.disturbed else ""),
                         "-" if load is None or load.host_drift is None else f"{load.host_drift:+.0%}"
                         + (" !" if load.drifted else ""),
                         "-" if load is None or load.compute_slowdown is None else f"{load.compute_slowdown:+.0%}"
                         + (" !" if load.slowed else ""),
                         "-" if s.breakdown is None or s.breakdown.overhead_s is None
                         else f"{s.breakdown.overhead_s / s.breakdown.step_s:+.1%}",
                         "-" if not s.link_timing else ("on time" if s.links_on_time else "LATE ("
                         + ", ".join(f"{t.mean_error_s * 1e6:+.0f} us" for t in s.link_timing if not t.ok) + ")"),
                         _late_cell(s),
                         f"{s.loss_first:.3f} -> {s.loss_last:.3f}" if s.loss_first is not None else "-"))
        placement = ", ".join(f"{p.host}" for p in self.stages)
        return table.render(["schedule", "bubble vs ref", "bubble own spans", "stretch", "step s", "tokens/s",
                             "peak in-flight", "budget", "steal / other", "host drift", "compute vs alone",
                             "own cost", "links", "spans late p99",
                             "loss"], rows,
                            f"\n{self.topology}: {len(self.stages)} stages ({placement}), shaper {self.shaper}, "
                            f"{self.transport}; {self.compute_line()}; bubble vs ref = 1 - uncontended compute / step time; "
                            f"! = spans stretched > {STRETCH_FLAG:.2f}x, host disturbed, its reference moved more than "
                            f"{HOST_DRIFT_BOUND:.0%} over the run (host drift: measured again), or the compute ran "
                            f"more than {COMPUTE_SLOWDOWN_FLAG:.0%} more CPU than alone (the run's own cost), or timed "
                            f"spans' p99 lateness beyond {LATE_P99_FRACTION:.0%} of a span (at least "
                            f"{LATE_FLOOR_S * 1e3:.1f} ms; worst stage shown); own cost = step over the ideal pipeline "
                            "(summary.json: breakdown)")


def _late_cell(s: ScheduleSummary) -> str:
    """The worst stage's p99 lateness of timed spans, `!` where some stage is beyond its bound."""
    if not s.span_lateness_per_stage:
        return "-"
    worst = max(x.p99_s for x in s.span_lateness_per_stage)
    return f"{worst * 1e3:.2f} ms" + ("" if s.lateness_ok else " !")
