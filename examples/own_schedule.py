"""A schedule of one's own, run like the built-in ones: the same executor, memory budget, metrics and trace.

A schedule is a function (stages, micro-batches) -> one list of actions per rank (workloads/schedule.py: RF/RB
post a receive, F/B compute, SF/SB send). Before a run starts, its action lists are computed for the run's shape,
validated, dry-run for deadlock and held against the memory budget: the two broken ones below are refused with
the reason, and the good one runs against 1F1B.

    sudo .venv/bin/python examples/own_schedule.py [RESULTS_DIR]
"""

from __future__ import annotations

import sys

from testbed import Action, Op, Testbed, UserScheduleError, register_schedule

results = sys.argv[1] if len(sys.argv) > 1 else "results/examples"


def one_ahead(stages: int, microbatches: int, early_send: bool = True) -> list[list[Action]]:
    """1F1B's order (p-1-s warm-up forwards, then one forward, one backward), each stage posting the receive of
    its next activation one forward ahead and each gradient's receive as soon as its activation has left."""
    ranks = []
    for s in range(stages):
        first, last = s == 0, s == stages - 1
        warmup = min(stages - 1 - s, microbatches)
        order = [("F", mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            order += [("F", warmup + i), ("B", i)]
        order += [("B", mb) for mb in range(microbatches - warmup, microbatches)]
        acts, posted = [], 0
        if not first:
            acts.append(Action(Op.RECV_F, 0))
            posted = 1
        for kind, mb in order:
            if kind == "F":
                if not first and posted < microbatches:
                    acts.append(Action(Op.RECV_F, posted))         # the next activation's receive, one ahead
                    posted += 1
                acts.append(Action(Op.FORWARD, mb))
                if not last:
                    if early_send:
                        acts.append(Action(Op.SEND_F, mb))
                    acts.append(Action(Op.RECV_B, mb))
            else:
                acts.append(Action(Op.BACKWARD, mb))
                if not last and not early_send:
                    acts.append(Action(Op.SEND_F, mb))             # too late: the next stage waits for it
                if not first:
                    acts.append(Action(Op.SEND_B, mb))
        ranks.append(acts)
    return ranks


def send_late(stages: int, microbatches: int) -> list[list[Action]]:
    """Broken: each activation is sent only after its own backward, which needs the gradient it would produce."""
    return one_ahead(stages, microbatches, early_send=False)


def greedy_receives(stages: int, microbatches: int) -> list[str]:
    """Broken for a tight budget: every receive posted up front (as text, one line per rank)."""
    lines = []
    for s in range(stages):
        recv = [f"RF{mb}" for mb in range(microbatches)] if s > 0 else []
        recv += [f"RB{mb}" for mb in range(microbatches)] if s < stages - 1 else []
        rest = [str(a) for a in one_ahead(stages, microbatches)[s] if a.op not in (Op.RECV_F, Op.RECV_B)]
        lines.append(" ".join(recv + rest))
    return lines


for name, fn in (("one-ahead", one_ahead), ("send-late", send_late), ("greedy-receives", greedy_receives)):
    register_schedule(name, fn)

with Testbed.up("2dc-1000km", name="ex-schedule", log=None) as tb:
    for broken in ("send-late", "greedy-receives"):
        try:
            tb.run([broken], microbatches=8, memory_budget="1f1b+0", compute="gpt-7b-h100", results=results, log=None)
        except UserScheduleError as exc:             # refused before anything ran
            print(f"refused: {exc}\n")
    run = tb.run(["1f1b", "one-ahead"], microbatches=8, iterations=2, memory_budget="1f1b+0", compute="gpt-7b-h100",
                 results=results, log=None)

print(f"{'schedule':<10} {'step (s)':>9} {'bubble':>7} {'peak in flight (MiB)':>21}   over 1000 km at 1 Gbit/s, budget 1f1b+0")
for row in run.rows():
    print(f"{row['schedule']:<10} {row['step_s']:>9.3f} {row['bubble_vs_reference']:>7.3f} "
          f"{row['peak_inflight_bytes'] / 2**20:>21.0f}")
print(f"action lists as run: {run.run_dir / 'user-schedules.json'}; trace: {run.run_dir / 'trace.json'}")
