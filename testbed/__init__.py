"""Emulated multi-datacenter testbed for geo-distributed pipeline-parallel training.

Layers, lowest first; a package imports only from packages below it (tests/test_layers.py keeps it so):
errors -> util -> topology -> plan -> state -> backends -> probe -> shaping -> deploy -> check -> run -> experiment -> cli.
Topologies describe, plans decide, backends build, shapers delay, checks measure, runs train, experiments sweep.
`workloads/` (the training side) imports nothing from here.

The Python API (testbed/api.py, the layer between experiment and cli) is importable from here, loaded on first
use so that the command line and the workers do not pay for it:

    from testbed import Testbed, At, link_down
    with Testbed.up("2dc-1000km") as tb:
        print(tb.run(["1f1b", "geopipe"], microbatches=8).to_frame())

`help(testbed.Testbed)` documents it; docs/api.md walks through it.
"""

from __future__ import annotations

from typing import Any

_API = ("Action", "At", "BackendError", "Direction", "EventRecord", "ExperimentResult", "ExperimentSpec", "Link",
        "LinkChange", "LinkControl", "LinkDown", "Node", "Op", "POINT_COLUMNS", "RunError", "RunResult", "RunSummary",
        "Schedule", "ScheduleError", "ScheduleSummary", "SweepPoint", "Testbed", "TestbedError", "UserScheduleError",
        "VerifyResult", "km", "link_down",
        "link_set", "LinkSweep", "register_schedule", "registered_schedules", "run_experiment", "schedule",
        "unregister_schedule")
__all__ = list(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        from testbed import api

        return getattr(api, name)
    raise AttributeError(f"module 'testbed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
