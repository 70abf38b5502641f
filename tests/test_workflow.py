"""The CI workflow (.github/workflows/test.yml) against GitHub's workflow schema and what it must keep doing
(README: "CI on Linux VMs"): a read-only token, no persisted credentials, the host and VM tiers as separate
steps with the VM tier running after a host failure, a timeout on every long step, junit XML kept from every job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "test.yml"


def test_the_workflow_passes_githubs_schema() -> None:
    checker = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_job_runs_both_tiers_and_keeps_their_results() -> None:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc["permissions"] == {"contents": "read"} and doc["concurrency"]["cancel-in-progress"] is True
    assert doc["env"]["CI"] == "true"
    for name, job in doc["jobs"].items():
        steps = job["steps"]
        checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@"))
        assert checkout["with"]["persist-credentials"] is False, name
        runs = [s for s in steps if "run" in s]
        host = next(s for s in runs if "make test-host" in s["run"] or "make -e test-host" in s["run"])
        vm = next(s for s in runs if "make vm-test" in s["run"])
        assert "--junitxml" in host["run"] and vm["if"].replace(" ", "") == "${{!cancelled()}}", name
        for step in (host, vm, *(s for s in runs if "make install" in s["run"])):
            assert step.get("timeout-minutes"), (name, step["name"])
        upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
        assert upload["if"].replace(" ", "") == "${{!cancelled()}}" and upload["with"]["path"] == "results/"
        assert any(str(s.get("uses", "")).startswith("actions/cache@") for s in steps), name
