"""The CI workflow (.github/workflows/test.yml) against GitHub's workflow schema and what it must keep doing
(README: "CI on Linux VMs"): a read-only token, no persisted credentials, the host and VM tiers as separate
steps with the VM tier running after a host failure, a timeout on every long step, junit XML kept from every job."""

from __future__ import annotations

import re
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
    tier_jobs = {name: job for name, job in doc["jobs"].items() if not _runs(job, "make vm-test-remote")}
    assert set(tier_jobs) == {"ubuntu", "debian"}
    for name, job in doc["jobs"].items():
        steps = job["steps"]
        checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@"))
        assert checkout["with"]["persist-credentials"] is False, name
        runs = [s for s in steps if "run" in s]
        if name not in tier_jobs:
            continue
        host = next(s for s in runs if "make test-host" in s["run"] or "make -e test-host" in s["run"])
        vm = next(s for s in runs if re.search(r"make vm-test\b(?!-)", s["run"]))
        assert "--junitxml" in host["run"] and vm["if"].replace(" ", "") == "${{!cancelled()}}", name
        for step in (host, vm, *(s for s in runs if "make install" in s["run"])):
            assert step.get("timeout-minutes"), (name, step["name"])
        upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
        assert upload["if"].replace(" ", "") == "${{!cancelled()}}" and upload["with"]["path"] == "results/"
        assert any(str(s.get("uses", "")).startswith("actions/cache@") for s in steps), name


def _runs(job: dict, command: str) -> list[dict]:
    return [s for s in job["steps"] if command in str(s.get("run", ""))]


def test_the_ssh_labs_rdma_cycle_runs_in_debians_stock_kernel_with_kvm() -> None:
    """`make vm-test-remote` (the remote cycle over RDMA in the stock kernel) has a job: in a Debian container (the
    7.x kernel is installed there only), /dev/kvm opened to QEMU, its own timeout past the Makefile's 90 min guest
    limit (so the guest's kill speaks first), no skip allowed, its junit XML kept."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    jobs = [job for job in doc["jobs"].values() if _runs(job, "make vm-test-remote")]
    assert len(jobs) == 1
    job = jobs[0]
    assert str(job["runs-on"]).startswith("ubuntu-") and job["container"]["image"].startswith("debian:")
    assert "--privileged" in job["container"]["options"] and _runs(job, "/dev/kvm") and _runs(job, "make install")
    (step,) = _runs(job, "make vm-test-remote")
    assert 90 < step["timeout-minutes"] < job["timeout-minutes"]
    allowed = REPO / step["env"]["CI_ALLOWED_SKIPS"]
    assert not [line for line in allowed.read_text().splitlines() if line.strip() and not line.startswith("#")]
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@"))
    assert upload["if"].replace(" ", "") == "${{!cancelled()}}" and upload["with"]["path"] == "results/"


# upload-artifact@v4+ refuses a name with any of these (its validation of artifact names)
ARTIFACT_NAME_FORBIDDEN = ('"', ":", "<", ">", "|", "*", "?", "\r", "\n", "\\", "/")


def matrix_entries(job: dict) -> list[dict[str, object]]:
    """A job's matrix as GitHub expands it: the product of its list-valued keys, less `exclude`, then each `include`
    entry extends the combinations it matches (without overwriting their own values) or adds one of its own."""
    matrix = dict(job.get("strategy", {}).get("matrix", {}))
    include, exclude = matrix.pop("include", []), matrix.pop("exclude", [])
    entries: list[dict[str, object]] = [{}]
    for key, values in matrix.items():
        entries = [{**entry, key: value} for entry in entries for value in values]
    entries = [e for e in entries if not any(all(e.get(k) == v for k, v in ex.items()) for ex in exclude)]
    if entries == [{}] and include:
        entries = []
    for extra in include:
        matched = [e for e in entries if all(e.get(k, v) == v for k, v in extra.items() if k in matrix)] if matrix else []
        for entry in matched:
            entry.update({k: v for k, v in extra.items() if k not in matrix})
        if not matched:
            entries.append(dict(extra))
    return entries or [{}]


def with_matrix(text: str, entry: dict[str, object]) -> str:
    """`text` with every ${{ matrix.KEY }} replaced by the entry's value; any other expression is left as it is."""
    return re.sub(r"\$\{\{\s*matrix\.([A-Za-z0-9_-]+)\s*\}\}", lambda m: str(entry[m.group(1)]), text)


def test_matrix_expansion_follows_githubs_rules() -> None:
    job = {"strategy": {"matrix": {"os": ["a", "b"], "py": [1, 2], "exclude": [{"os": "b", "py": 2}],
                                   "include": [{"os": "a", "extra": "x"}, {"os": "c", "py": 3}]}}}
    assert matrix_entries(job) == [{"os": "a", "py": 1, "extra": "x"}, {"os": "a", "py": 2, "extra": "x"},
                                   {"os": "b", "py": 1}, {"os": "c", "py": 3}]
    assert matrix_entries({"strategy": {"matrix": {"include": [{"image": "d:12", "slug": "d-12"}]}}}) == [
        {"image": "d:12", "slug": "d-12"}]
    assert with_matrix("results-${{ matrix.image }}", {"image": "debian:12"}) == "results-debian:12"


def test_every_artifact_name_is_one_upload_artifact_accepts() -> None:
    """`results-${{ matrix.image }}` with image debian:12 failed the upload: every matrix entry's name is checked."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    names = []
    for job_name, job in doc["jobs"].items():
        for step in job["steps"]:
            if not str(step.get("uses", "")).startswith("actions/upload-artifact@"):
                continue
            for entry in matrix_entries(job):
                name = with_matrix(step["with"]["name"], entry)
                assert "${{" not in name, f"{job_name}: cannot evaluate {name!r} here; keep artifact names to matrix values"
                bad = [c for c in ARTIFACT_NAME_FORBIDDEN if c in name]
                assert not bad, f"{job_name}: artifact name {name!r} has {bad}, which upload-artifact refuses"
                names.append(name)
    assert names and len(names) == len(set(names)), f"artifact names must exist and differ per job and entry: {names}"


def test_every_allowed_skips_list_the_workflow_names_exists() -> None:
    """A step's CI_ALLOWED_SKIPS (tests/conftest.py) names a file in the repo; Debian's stock-kernel tier has one."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    lists = {(name, step["name"]): step["env"]["CI_ALLOWED_SKIPS"] for name, job in doc["jobs"].items()
             for step in job["steps"] if "CI_ALLOWED_SKIPS" in step.get("env", {})}
    assert ("debian", "Stock-kernel tier (QEMU)") in lists
    for where, path in lists.items():
        assert (REPO / path).is_file(), (where, path)
