"""CPU steal has one definition, shared by the single machine's monitor and the remote cycle."""

from __future__ import annotations

import pytest

from testbed.util.hostload import steal_fraction


def test_steal_is_of_the_first_eight_fields_guest_time_already_counted_in_user() -> None:
    before = [100, 0, 50, 800, 0, 0, 10, 40, 30, 0]           # user nice system idle iowait irq softirq steal guest gn
    after = [200, 0, 100, 1600, 0, 0, 20, 80, 90, 0]          # guest +60 is inside user's +100
    assert steal_fraction(before, after) == pytest.approx(40 / (100 + 50 + 800 + 10 + 40))


def test_no_time_passed_or_no_steal_field_is_no_steal() -> None:
    assert steal_fraction([1, 2, 3, 4], [1, 2, 3, 4]) == 0.0
    assert steal_fraction([1, 2, 3, 4], [5, 6, 7, 8]) == 0.0


class _Clock:
    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0)


def _stat(cpu: list[int], procs_running: int) -> str:
    return f"cpu  {' '.join(map(str, cpu))}\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 5\nprocs_running {procs_running}\n"


def _finish(tmp_path, monkeypatch, before: list[int], after: list[int], *, own_s: tuple[float, float],
            daemons: list[float | None] | None = None, samples: tuple[int, ...] = (), running_at_end: int = 1):
    """LoadMonitor over scripted readings: /proc/stat (`cpu` line in ticks of 1/100 s), one second of wall time,
    this process's CPU seconds before and after, the delay daemons' CPU seconds before and after."""
    from types import SimpleNamespace

    from testbed.util import hostload

    stat = tmp_path / "stat"
    stat.write_text(_stat(before, 99))
    monkeypatch.setattr(hostload, "time", SimpleNamespace(monotonic=_Clock(100.0, 101.0)))
    monkeypatch.setattr(hostload, "os", SimpleNamespace(sysconf=lambda name: 100))
    monkeypatch.setattr(hostload, "_own_cpu_s", _Clock(*own_s))
    monitor = hostload.LoadMonitor(_Clock(*daemons) if daemons else None, stat=stat)
    for running in samples:
        stat.write_text(_stat(after, running))
        monitor.sample()
    stat.write_text(_stat(after, running_at_end))
    return monitor.finish()


# two cores for one second: 200 ticks in the first eight fields (guest, the ninth, is already inside user)
BEFORE = [1000, 0, 500, 8000, 0, 0, 100, 0, 300, 0]


def test_a_quiet_host_is_not_disturbed(tmp_path, monkeypatch) -> None:
    # busy 120 ticks = 1.2 s of CPU: 1.1 s the run's own, 0.05 s the delay daemons', 0.05 s anyone else's
    after = [1100, 0, 520, 8078, 0, 0, 100, 2, 350, 0]
    load = _finish(tmp_path, monkeypatch, BEFORE, after, own_s=(10.0, 11.1), daemons=[3.0, 3.05], samples=(1, 3, 2))
    assert load.wall_s == pytest.approx(1.0)
    assert load.steal_fraction == pytest.approx(2 / 200)
    assert load.foreign_fraction == pytest.approx(0.05 / 2.0)
    assert load.daemon_cpu_fraction == pytest.approx(0.05)
    assert (load.run_queue_mean, load.run_queue_max) == (2.0, 3)
    assert not load.disturbed and load.reasons == []


def test_steal_past_its_bound_disturbs_the_run(tmp_path, monkeypatch) -> None:
    after = [1100, 0, 500, 8088, 0, 0, 100, 12, 300, 0]    # 12 of 200 ticks stolen: 6% > 5%
    load = _finish(tmp_path, monkeypatch, BEFORE, after, own_s=(10.0, 11.0), samples=(2,))
    assert load.steal_fraction == pytest.approx(0.06) and load.foreign_fraction == pytest.approx(0.0)
    assert load.disturbed and load.reasons == ["CPU steal 6.0% > 5%"]
    assert load.daemon_cpu_fraction is None


def test_other_processes_past_their_bound_disturb_the_run(tmp_path, monkeypatch) -> None:
    # busy 150 ticks = 1.5 s; the run used 1.0 s (the daemons' reading is gone: counted as 0): 0.5 s of 2 s foreign
    after = [1130, 0, 520, 8050, 0, 0, 100, 0, 300, 0]
    load = _finish(tmp_path, monkeypatch, BEFORE, after, own_s=(10.0, 11.0), daemons=[3.0, None], running_at_end=4)
    assert load.foreign_fraction == pytest.approx(0.25) and load.steal_fraction == 0.0
    assert load.disturbed and load.reasons == ["other processes used 25.0% > 10% of the CPU"]
    assert load.daemon_cpu_fraction is None
    assert (load.run_queue_mean, load.run_queue_max) == (4.0, 4)   # no sample: one reading at the end
