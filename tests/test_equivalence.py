"""The real-arithmetic check beside the paper's figures (workloads/equivalence.py, testbed/experiment/
real_beside.py): one process's training is the reference the stages' gradients are held to, a gap of 1 % in one
element is seen, and a run is right only if its losses match one process's and fall."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from testbed.experiment.real_beside import RealBesideResult  # noqa: E402
from workloads.equivalence import largest_gradient_gap, train_in_one_process  # noqa: E402
from workloads.model import _reference_name, build_stages, layer_split  # noqa: E402
from workloads.records import GPTConfig  # noqa: E402

CFG = GPTConfig(n_layer=3, n_embd=32, n_head=4, block_size=16)


def _dump_as_stages(tmp_path: Path, grads: dict[str, torch.Tensor], stages: int) -> None:
    """The reference's gradients cut into the stages' files, named as each stage names its parameters."""
    for rank, (stage, (first, _)) in enumerate(zip(build_stages(CFG, stages), layer_split(CFG.n_layer, stages),
                                                   strict=True)):
        own = {n: grads[_reference_name(n, first)].clone() for n, _ in stage.named_parameters()}
        torch.save(own, tmp_path / f"grads-rank-{rank}.pt")


def test_one_process_trains_and_the_stages_gradients_are_held_to_it(tmp_path: Path) -> None:
    one = train_in_one_process(CFG, microbatches=4, microbatch_size=2, steps=6, lr=3e-3, seed=1234)
    assert len(one.losses) == 6 and one.losses[-1] < one.losses[0]
    _dump_as_stages(tmp_path, one.grads, 3)
    assert largest_gradient_gap(tmp_path, one, CFG, 3) == 0.0
    wrong = torch.load(tmp_path / "grads-rank-1.pt")
    name = next(iter(wrong))
    wrong[name].view(-1)[0] += 0.01 * wrong[name].abs().max()       # one element off by 1 % of its tensor's largest
    torch.save(wrong, tmp_path / "grads-rank-1.pt")
    assert largest_gradient_gap(tmp_path, one, CFG, 3) == pytest.approx(0.01, rel=1e-3)


def _fields(r: RealBesideResult) -> dict:
    return {k: v for k, v in r.to_json().items() if k != "ok"}


def test_a_run_is_right_only_if_its_losses_match_one_process_and_fall() -> None:
    right = RealBesideResult(schedule="geopipe", step_s=1.0, fb_ms=5.0, loss_first=4.80, loss_last=4.10,
                             one_process_first=4.80, one_process_last=4.1001, gradient_gap=2e-6, distance_km=1000)
    assert right.ok
    assert not RealBesideResult(**{**_fields(right), "loss_last": 4.2}).ok        # not as one process
    assert not RealBesideResult(**{**_fields(right), "gradient_gap": 0.01}).ok
    flat = {**_fields(right), "loss_last": 4.8, "one_process_last": 4.8}
    assert not RealBesideResult(**flat).ok                                                    # did not fall
