"""Real training: pipelined gradients equal a single-process reference; loss goes down; and (root tier)
training across namespaces writes the summary contract; a killed worker fails the run fast and cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import BACKEND_PARAMS, REPO, netns_with_prefix, run_cli  # noqa: E402

from workloads import schedule as S  # noqa: E402
from workloads.data import batches  # noqa: E402
from workloads.executor import StageExecutor  # noqa: E402
from workloads.model import GPTConfig, build_reference, build_stages, loss_fn  # noqa: E402
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
            ex = StageExecutor(modules[r], r, stages, LocalTransport(hub, r), (mbs, CFG.block_size, CFG.n_embd), m,
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


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "geopipe"])
@pytest.mark.parametrize("stages", [2, 4])
def test_pipeline_gradients_equal_single_process_reference(name: str, stages: int) -> None:
    m, mbs = 6, 2
    geo = None
    if name == "geopipe":
        geo = S.size_geopipe(stages, m, link_delay_s=[0.005] * (stages - 1), link_bytes_per_s=[1.25e8] * (stages - 1),
                             activation_bytes=mbs * CFG.block_size * CFG.n_embd * 4, compute_s=[0.001] * stages,
                             stash_bytes=[1] * stages, memory_budget=None)
    modules, xs, ys = _pipeline_grads(name, stages, m, mbs, geo)
    ref = build_reference(CFG)
    (sum(loss_fn(ref(a), b) for a, b in zip(xs, ys, strict=True)) / m).backward()
    ref_grads = dict(ref.named_parameters())
    first = 0
    for module in modules:
        for pname, p in module.named_parameters():
            rname = pname
            if pname.startswith("blocks."):
                _, idx, rest = pname.split(".", 2)
                rname = f"blocks.{int(idx) + first}.{rest}"
            torch.testing.assert_close(p.grad, ref_grads[rname].grad, rtol=1e-4, atol=1e-6)
        first += len(module.blocks)


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


@pytest.mark.root
@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_training_across_namespaces_writes_summary(backend: str, unique_name: str, tmp_path: Path) -> None:
    run_cli("up", "2dc-1000km", "--name", unique_name, "--verify", "skip", "--backend", backend, timeout=300)
    try:
        out = run_cli("run", unique_name, "--schedule", "1f1b,geopipe", "--microbatches", "8", "--iterations", "2",
                      "--layers", "2", "--width", "64", "--results", str(tmp_path), timeout=600)
    finally:
        run_cli("down", unique_name)
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["topology"] == "2dc-1000km" and summary["shaper"] in ("delayline", "netem")
    assert summary["backend"] == backend
    assert summary["transport"] == "gloo-tcp" and summary["kernel"] and summary["lossless_ok"]
    assert [s["schedule"] for s in summary["schedules"]] == ["1f1b", "geopipe"]
    for s in summary["schedules"]:
        for key in ("bubble_ratio", "bubble_ratio_per_stage", "step_time_s", "tokens_per_s", "exposed_comm_s",
                    "peak_inflight_activation_bytes"):
            assert s[key] is not None, key
        assert 0 < s["bubble_ratio"] < 1 and len(s["bubble_ratio_per_stage"]) == 2
    one, geo = summary["schedules"]
    assert geo["step_time_s"] < one["step_time_s"]          # 5 ms one-way: overlap must win
    assert geo["peak_inflight_activation_bytes"] > one["peak_inflight_activation_bytes"]
    assert summary["links"][0]["configured_delay_s"] == pytest.approx(0.005)
    trace = json.loads(next(tmp_path.glob("*/trace.json")).read_text())
    assert any(e.get("name") == "F0" for e in trace["traceEvents"])
    assert "geopipe" in out.stdout


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
            logs = list(tmp_path.glob("*/1f1b/worker-1.log"))
            if len(workers) == 2 and list(tmp_path.glob("*/1f1b/worker-0.json")) and logs:
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
    out = run_cli("experiment", "--distances", "0,500", "--focus", "500", "--repetitions", "2", "--budgets", "2",
                  "--microbatches", "8",
                  "--iterations", "1", "--results", str(tmp_path), timeout=900)
    exp = next(tmp_path.glob("*-experiment"))
    doc = json.loads((exp / "summary.json").read_text())
    assert len(doc["points"]) == 2 * 3 + 2 + 1
    assert all(p["predicted_bubble"] is not None for p in doc["points"])
    assert json.loads((exp / "model_inputs.json").read_text())["message_overhead_s"] >= 0
    for name in ("report.md", "report.html", "bubble_vs_distance.png", "timeline_1f1b_vs_geopipe.png",
                 "memory_budget.png", "points.csv", "topology.yaml", "plan.json", "environment.json"):
        assert (exp / name).exists(), name
    assert "bubble ratio per schedule" in out.stdout
    assert netns_with_prefix("tb-exp") == []
