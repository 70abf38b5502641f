"""Real training: pipelined gradients equal a single-process reference; loss goes down; and (root tier)
training across namespaces writes the summary contract; a killed worker fails the run fast and cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch  # noqa: E402  (a broken install fails here, it does not skip)
from conftest import BACKEND_PARAMS, REPO, netns_with_prefix, run_cli  # noqa: E402
from contract import check_summary  # noqa: E402

from workloads import schedule as S  # noqa: E402
from workloads.data import batches  # noqa: E402
from workloads.executor import StageExecutor  # noqa: E402
from workloads.layouts import TORCH_SCHEDULES  # noqa: E402
from workloads.memory import BudgetExceeded, footprint_bytes  # noqa: E402
from workloads.model import GPTConfig, build_reference, build_stages, loss_fn  # noqa: E402
from workloads.sizing import size_geopipe  # noqa: E402
from workloads.transport import LocalHub, LocalTransport  # noqa: E402

CFG = GPTConfig(n_layer=4, n_embd=64, n_head=4, block_size=32)


def _pipeline_grads(name: str, stages: int, m: int, mbs: int, geo: S.GeoPipeSizing | None = None):
    x, y = batches(m * mbs, CFG.block_size, seed=7).next()
    xs, ys = list(x.chunk(m)), list(y.chunk(m))
    modules = build_stages(CFG, stages)
    hub = LocalHub(stages)
    sched = S.build(name, stages, m, geo)
    errors = []

    def run(r: int) -> None:
        try:
            ex = StageExecutor.arithmetic(modules[r], r, stages, LocalTransport(hub, r), (mbs, CFG.block_size, CFG.n_embd), m,
                               loss_fn)
            ex.run(sched[r], xs if r == 0 else None, ys if r == stages - 1 else None)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return modules, xs, ys


def _compare_with_reference(grads_per_stage: list[dict[str, torch.Tensor]], xs: list[torch.Tensor],
                            ys: list[torch.Tensor], cfg: GPTConfig = CFG) -> None:
    """Pipelined gradients, stage by stage, against the whole model's in one process on the same micro-batches."""
    ref = build_reference(cfg)
    (sum(loss_fn(ref(a), b) for a, b in zip(xs, ys, strict=True)) / len(xs)).backward()
    ref_grads = dict(ref.named_parameters())
    first = 0
    for grads in grads_per_stage:
        blocks = {int(n.split(".")[1]) for n in grads if n.startswith("blocks.")}
        for pname, grad in grads.items():
            rname = pname
            if pname.startswith("blocks."):
                _, idx, rest = pname.split(".", 2)
                rname = f"blocks.{int(idx) + first}.{rest}"
            torch.testing.assert_close(grad, ref_grads[rname].grad, rtol=1e-4, atol=1e-6)
        first += len(blocks)


@pytest.mark.parametrize("name", S.SCHEDULES)
@pytest.mark.parametrize("stages", [2, 4])
def test_pipeline_gradients_equal_single_process_reference(name: str, stages: int) -> None:
    m, mbs = 6, 2
    geo = None
    if name == "geopipe":
        geo = size_geopipe(stages, m, link_delay_s=[0.005] * (stages - 1), link_bytes_per_s=[1.25e8] * (stages - 1),
                           activation_bytes=mbs * CFG.block_size * CFG.n_embd * 4, forward_s=[0.0005] * stages,
                           backward_s=[0.0005] * stages, stash_bytes=[1] * stages)
        assert geo.extra_inflight[0] > 0                       # the schedule under test really runs ahead
    modules, xs, ys = _pipeline_grads(name, stages, m, mbs, geo)
    _compare_with_reference([{n: p.grad for n, p in mod.named_parameters()} for mod in modules], xs, ys)


class _Affine(torch.nn.Module):
    """A stage of the hand-computed memory test: y = relu(x W^T + b), W 8x8."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def _run_tiny(name: str, budget: int | None = None) -> list:
    """Three _Affine stages, micro-batches of 2 x 8 floats (64 B), local transport; the per-rank traces."""
    stages, m = 3, 4
    torch.manual_seed(0)
    modules = [_Affine() for _ in range(stages)]
    xs = [torch.randn(2, 8) for _ in range(m)]
    ys = [torch.randn(2, 8) for _ in range(m)]
    hub, sched, traces, errors = LocalHub(stages), S.build(name, stages, m), [None] * stages, []

    def run(r: int) -> None:
        try:
            ex = StageExecutor.arithmetic(modules[r], r, stages, LocalTransport(hub, r), (2, 8), m,
                               lambda out, y: torch.nn.functional.mse_loss(out, y))
            ex.budget_bytes = budget
            traces[r] = ex.run(sched[r], xs if r == 0 else None, ys if r == stages - 1 else None)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
            hub.barrier_.abort()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20 if budget is None else 3)
    if errors:
        raise errors[0]
    return traces


def test_inflight_memory_is_exactly_what_a_stage_holds() -> None:
    """Hand-computed. The middle stage (rank 1 of 3) keeps per micro-batch its 64 B input (saved by the linear
    layer for W's gradient) and its 64 B output (saved by relu): 128 B; the 256 B weight and 32 B bias never
    count. Under 1F1B it holds 2 micro-batches at its peak plus the gradient receive posted just before the
    first backward: 2 x 128 + 64 = 320 B. Rank 0's input is the data batch (held anyway, not counted): 64 B
    per micro-batch, 3 pending + one gradient receive = 256 B. 1f1b-prefetch: the memory model's figure."""
    one = _run_tiny("1f1b")
    assert one[1].stash_bytes == [128] * 4 and one[0].stash_bytes == [64] * 4
    assert one[1].peak_inflight_bytes == 2 * 128 + 64
    assert one[0].peak_inflight_bytes == 3 * 64 + 64
    pre = _run_tiny("1f1b-prefetch")
    look = S.GeoPipeSizing.prefetch(3, 4).recv_lookahead
    for r in range(3):
        assert pre[r].peak_inflight_bytes == footprint_bytes(r, 3, 4, extra=0, lookahead=look[r],
                                                             stash_bytes=pre[r].stash_bytes[0], activation_bytes=64)


def test_a_budget_the_schedule_would_exceed_stops_it_with_both_figures() -> None:
    """Every stage of gpipe goes over 300 B (which one is stopped first depends on the threads' timing); the
    error names that stage and both figures, and the held figure is over the budget."""
    unbounded = [t.peak_inflight_bytes for t in _run_tiny("gpipe")]
    with pytest.raises(BudgetExceeded, match=r"stage (\d) holds (\d+) B in flight, over its memory budget of 300 B") as err:
        _run_tiny("gpipe", budget=300)
    stage, held = map(int, re.search(r"stage (\d) holds (\d+) B", str(err.value)).groups())
    assert held > 300 and unbounded[stage] > 300                # without enforcement it would have gone over


def test_loss_goes_down_over_a_short_training_run() -> None:
    modules = build_stages(CFG, 2)
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in modules]
    data = batches(8, CFG.block_size, seed=3)
    losses = []
    for _ in range(30):
        x, y = data.next()
        for o in opts:
            o.zero_grad()
        loss = loss_fn(modules[1](modules[0](x)), y)
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (/proc/stat: every state but idle, iowait and steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4] - fields[7]) / os.sysconf("SC_CLK_TCK")


@pytest.mark.root
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_training_across_namespaces_writes_summary(backend: str, unique_name: str, tmp_path: Path) -> None:
    run_cli("up", "2dc-1000km", "--name", unique_name, "--verify", "skip", "--backend", backend, timeout=300)
    try:
        busy_before = _machine_busy_s()
        out = run_cli("run", unique_name, "--schedule", "1f1b,1f1b-prefetch,geopipe", "--microbatches", "8",
                      "--iterations", "2", "--layers", "2", "--width", "64", "--memory-budget", "1f1b+2",
                      "--results", str(tmp_path), timeout=600)
        busy = _machine_busy_s() - busy_before
    finally:
        run_cli("down", unique_name)
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    check_summary(summary, ["1f1b", "1f1b-prefetch", "geopipe"], stages=2)
    # the CPU ledger against /proc/stat read here: the busy CPU it shows over the steady iterations of every
    # schedule is part of what the machine was busy over the whole command (start-up, warm-ups, references)
    ledger_busy = sum(s["iterations"] * sum(c["cpu_s"] for c in s["breakdown"]["cpu"]
                                            if not c["name"].startswith(("idle", "steal", "of which")))
                      for s in summary["schedules"])
    assert 0 < ledger_busy < busy, (ledger_busy, busy)
    assert summary["topology"] == "2dc-1000km" and summary["backend"] == backend
    # `--transport auto` (the default) on a testbed without rxe devices: TCP, and the summary says why.
    assert summary["transport"] == "gloo-tcp" and summary["transport_reason"].startswith("--transport auto took tcp")
    assert "transport tcp: --transport auto took tcp" in out.stdout
    one, pre, geo = summary["schedules"]
    # 5 ms one-way: posting early beats just-in-time receives. Geopipe vs 1f1b-prefetch needs more than these 8
    # micro-batches of ~2 ms to show above the noise: bench-pipeline and the demo measure it at 64.
    assert max(geo["step_time_s"], pre["step_time_s"]) < one["step_time_s"]
    assert geo["peak_inflight_activation_bytes"] > pre["peak_inflight_activation_bytes"]
    assert geo["geopipe_sizing"]["extra_inflight"][0] >= 1
    assert summary["links"][0]["configured_delay_s"] == pytest.approx(0.005)
    trace = json.loads(next(tmp_path.glob("*/trace.json")).read_text())
    assert any(e.get("name") == "F0" for e in trace["traceEvents"])
    assert "geopipe" in out.stdout


@pytest.mark.root
def test_geopipe_beats_the_strong_baseline_in_a_real_run(unique_name: str, tmp_path: Path) -> None:
    """Overlap, not early posting: against 1f1b-prefetch (which posts its receives early too), in one launch
    that interleaves the two, at a size where the 12 ms round trip is several micro-batches of compute
    (32 of ~2-4 ms, 5 ms one-way): 1f1b-prefetch waits a round trip per two micro-batches on stage 0, geopipe
    keeps enough extra in flight to cover it. A geopipe that plans no extra micro-batch is 1f1b-prefetch."""
    run_cli("run", "2dc-1000km", "--name", unique_name, "--schedule", "1f1b-prefetch,geopipe", "--microbatches",
            "32", "--iterations", "3", "--layers", "2", "--width", "64", "--memory-budget", "1f1b+6",
            "--results", str(tmp_path), timeout=600)
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    pre, geo = summary["schedules"]
    assert geo["geopipe_sizing"]["extra_inflight"][0] >= 1, geo["geopipe_sizing"]   # 2 here, 1 on a slower host
    ratio = geo["step_time_s"] / pre["step_time_s"]
    assert ratio < 0.95, (ratio, pre["step_time_s"], geo["step_time_s"])
    assert geo["budget_ok"] and geo["peak_inflight_activation_bytes"] > pre["peak_inflight_activation_bytes"]
    assert netns_with_prefix(f"tb-{unique_name}-") == []


@pytest.mark.root
def test_gradients_over_gloo_between_namespaces_equal_the_single_process_reference(unique_name: str,
                                                                                   tmp_path: Path) -> None:
    """The real transport: every schedule of ours across two namespaces joined by the shaped link; with lr 0
    the last iteration's gradients are those of the initial weights on that iteration's batch."""
    m, mbs, model = 4, 2, {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 32}
    run_cli("run", "2dc-1000km", "--name", unique_name, "--schedule", "1f1b,1f1b-prefetch,geopipe", "--microbatches",
            str(m), "--microbatch-size", str(mbs), "--iterations", "1", "--layers", "2", "--width", "64", "--seq-len",
            "32", "--lr", "0", "--dump-gradients", "--results", str(tmp_path), timeout=600)
    data = batches(m * mbs, model["block_size"], seed=1234)
    data.next()                                                    # the warm-up iteration's batch
    x, y = data.next()
    cfg = GPTConfig(**model)
    for schedule in ("1f1b", "1f1b-prefetch", "geopipe"):
        run_dir = next(tmp_path.glob(f"*/{schedule}"))
        grads = [torch.load(run_dir / f"grads-rank-{r}.pt") for r in range(2)]
        _compare_with_reference(grads, list(x.chunk(m)), list(y.chunk(m)), cfg)
    assert netns_with_prefix(f"tb-{unique_name}-") == []


@pytest.mark.root
def test_every_pytorch_schedule_runs_across_namespaces_on_the_same_model(unique_name: str, tmp_path: Path) -> None:
    """PyTorch's seven schedules over gloo between the two DCs: each reports a step time, a bubble against
    its ranks' uncontended compute (two chunks per rank for the multi-stage ones), and the same first loss
    (the same model, initialisation and batch, whichever rank holds the last chunk)."""
    schedules = list(TORCH_SCHEDULES)
    run_cli("run", "2dc-1000km", "--name", unique_name, "--schedule", ",".join(schedules), "--microbatches", "4",
            "--iterations", "1", "--layers", "4", "--width", "64", "--seq-len", "32", "--results", str(tmp_path),
            timeout=900)
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert [s["schedule"] for s in summary["schedules"]] == schedules
    firsts = [s["loss_first"] for s in summary["schedules"]]
    assert all(f == pytest.approx(firsts[0], rel=1e-4) for f in firsts), firsts
    for s in summary["schedules"]:
        assert 0 < s["bubble_vs_reference"] < 1 and len(s["reference_compute_s_per_stage"]) == 2, s["schedule"]
    assert netns_with_prefix(f"tb-{unique_name}-") == []


@pytest.mark.root
def test_killed_worker_fails_the_run_fast_and_cleanly(unique_name: str, tmp_path: Path) -> None:
    run_cli("up", "2dc-1000km", "--name", unique_name, "--verify", "skip", timeout=300)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", unique_name, "--schedule", "1f1b",
                                 "--microbatches", "8", "--iterations", "200", "--layers", "2", "--width", "64",
                                 "--results", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        state = Path(os.environ["TESTBED_STATE_DIR"]) / f"{unique_name}.json"
        deadline = time.monotonic() + 120
        victim = None
        while time.monotonic() < deadline and victim is None:
            workers = [p for p in json.loads(state.read_text())["processes"] if p["role"] == "worker"]
            logs = list(tmp_path.glob("*/worker-1.log"))
            if len(workers) == 2 and list(tmp_path.glob("*/worker-0.json")) and logs:
                time.sleep(8)        # let it train
                victim = workers[1]["pid"]
            time.sleep(0.2)
        assert victim, "workers never started"
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert time.monotonic() - killed_at < 15
        assert "worker 1 exited with -9" in err
        remaining = [p for p in json.loads(state.read_text())["processes"] if p["role"] == "worker"]
        assert remaining == []
        for p in workers:
            assert not Path(f"/proc/{p['pid']}").exists() or "zombie" in Path(f"/proc/{p['pid']}/status").read_text()
    finally:
        run_cli("down", unique_name)
    assert netns_with_prefix(f"tb-{unique_name}-") == []


@pytest.mark.root
@pytest.mark.slow
def test_small_experiment_end_to_end(tmp_path: Path) -> None:
    out = run_cli("experiment", "--distances", "0,500", "--focus", "500", "--repetitions", "2", "--memory-budgets",
                  "1f1b+2", "--focus-schedule", "torch-1f1b", "--rates", "", "--microbatches", "8",
                  "--iterations", "2", "--results", str(tmp_path), timeout=900)
    exp = next(tmp_path.glob("*-experiment"))
    doc = json.loads((exp / "summary.json").read_text())
    assert len(doc["points"]) == 3 + 4 + 4 + 1        # 0 km; 500 km + torch-1f1b; a second repetition; one budget
    assert all(p["predicted_bubble"] is not None for p in doc["points"])
    # The model is fed by the 0 km 1f1b run (compute, executor, probed message cost) and fitted to nothing: its
    # steps at 500 km, which it was never shown, are predictions (20 %: 8 micro-batches, 2 iterations are noisy).
    far = [p for p in doc["points"] if p["distance_km"] == 500 and p["sweep"] in ("distance", "repeat")
           and p["schedule"] in ("1f1b", "1f1b-prefetch", "geopipe")]
    errors = {p["label"]: p["predicted_step_s"] / p["measured"]["step_time_s"] - 1 for p in far}
    assert len(far) == 6 and all(abs(e) < 0.2 for e in errors.values()), errors
    assert 0 <= json.loads((exp / "model_inputs.json").read_text())["message_overhead_s"] < 0.005
    assert all(p["measured"]["budget_ok"] for p in doc["points"])
    for name in ("report.md", "report.html", "bubble_vs_distance.png", "timeline_1f1b_vs_geopipe.png",
                 "memory_budget.png", "points.csv", "topology.yaml", "plan.json", "environment.json"):
        assert (exp / name).exists(), name
    assert "at 500 km, budget 1f1b+1" in out.stdout and "geopipe vs 1f1b-prefetch" in out.stdout
    assert netns_with_prefix("tb-exp") == []
