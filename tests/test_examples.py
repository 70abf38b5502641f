"""The three scripts in examples/, run as a user runs them (`python examples/X.py RESULTS`), each bringing its own
testbed up and down: a sweep of rate x distance into a plot, a link outage in the middle of training, a schedule
of one's own. Each must finish, say what the docs say it shows, and leave nothing behind. Their output is
printed (pytest -s shows it)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, netns_with_prefix

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _run(script: str, results: Path, timeout: float = 240) -> str:
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO / "examples" / script), str(results)], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout)
    print(f"\n$ python examples/{script}  ({time.monotonic() - started:.0f} s)\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert netns_with_prefix("tb-ex-") == []
    return done.stdout


def test_link_outage_mid_training(tmp_path: Path) -> None:
    out = _run("link_outage.py", tmp_path)
    assert re.search(r"link dc-a <-> dc-b down for 200 ms: applied at [\d.]+ s, undone at [\d.]+ s .*restored: True", out)
    times = [float(x) for x in re.findall(r"iteration \d: ([\d.]+) s", out)]
    assert len(times) == 3 and times[1] > max(times[0], times[2]) + 0.15          # the outage shows in its iteration
    assert "lossless: True (packets lost on lossless links: 0)" in out


def test_a_schedule_of_ones_own(tmp_path: Path) -> None:
    out = _run("own_schedule.py", tmp_path)
    assert re.search(r"refused: schedule 'send-late' refused before it ran: .*deadlock: rank 0 at B0", out)
    assert re.search(r"refused: schedule 'greedy-receives' refused before it ran: stage \d would hold .* over its "
                     r"memory budget", out)
    rows = re.findall(r"^(1f1b|one-ahead) +([\d.]+) +([\d.]+) +(\d+)$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1f1b", "one-ahead"]
    assert (next(tmp_path.glob("*/user-schedules.json"))).exists()


def test_a_sweep_of_rate_and_distance_into_a_plot(tmp_path: Path) -> None:
    out = _run("sweep_rate_distance.py", tmp_path)
    rows = re.findall(r"^ +(\d+) Mb +(\d+) +(1f1b|geopipe) +([\d.]+) +([\d.]+)$", out, re.MULTILINE)
    assert len(rows) == 12 and {(r[0], r[1]) for r in rows} == {(rate, km) for rate in ("1000", "200")
                                                                  for km in ("0", "1000", "2000")}
    assert next(tmp_path.glob("*/bubble_rate_distance.png")).stat().st_size > 10_000
