"""The command line's error paths, walked without bringing anything up: every refusal is one line on stderr that
starts with `testbed: ` and names the fix, the exit status is not 0, and no traceback is printed. Also: one error
root for the whole package, the commands as one table (parser, root check, usage text), a `--help` with defaults,
help and an example for every option, and the old option spellings accepted with a notice.

Run in-process through `main(argv)` (with the state directory pointed at an empty folder and the commands that
could bring a testbed up replaced by a tripwire: every case must be refused by its checks first), and a few in a
child process as a user would run them. Cases that reach a handler that needs root expect the root refusal when
the tests do not run as root."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import cli
from testbed.errors import TestbedError
from testbed.util.interrupts import Interrupted
from workloads.layouts import TORCH_SCHEDULES
from workloads.schedule import SCHEDULES

REPO = Path(__file__).resolve().parent.parent
ROOT = os.geteuid() == 0
NOTICE = "the old spelling goes in the next release"
BRINGS_UP = ("up", "run", "experiment")
"""Commands whose handler brings a testbed up: here their handlers are a tripwire."""


def _tripwire(args: argparse.Namespace) -> int:
    raise AssertionError(f"'testbed {args.cmd}' passed its checks: it would have brought a testbed up")


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No testbed up (an empty state directory), nothing brought up, SIGPIPE as it was."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, handler=_tripwire) if c.name in BRINGS_UP else c
                                               for c in cli.COMMANDS))
    sigpipe = signal.getsignal(signal.SIGPIPE)
    yield
    signal.signal(signal.SIGPIPE, sigpipe)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    """`testbed ARGV` in-process: its exit status and its stderr lines other than renamed options' notices."""
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [line for line in err.splitlines() if NOTICE not in line]


def as_root(fragment: str) -> str:
    """What a case that reaches a root command's handler says: its own reason as root, the root refusal if not."""
    return fragment if ROOT else "needs root (network namespaces); run it with sudo"


BAD_TOPOLOGY = REPO / "tests" / "fixtures" / "bad" / "bad-delay-unit.yaml"

CASES = [
    (["plan", "3dc-lin"], "did you mean '3dc-line'?"),
    (["plan", "/nonexistent/topology.yaml"], "give a shipped topology (2dc-1000km"),
    (["plan", str(BAD_TOPOLOGY)], "links[0].b_to_a.delay: unknown time unit 'secs'"),
    (["up", "3dc-lin"], "did you mean '3dc-line'?"),
    (["up", str(BAD_TOPOLOGY)], "unknown time unit 'secs'"),
    (["run", "--compute", "bogus"], "choose one of: real, replay, replay:FILE, gpt-7b-h100"),
    (["run", "--compute", "gpt-7b-h10"], "did you mean 'gpt-7b-h100'?"),
    (["run", "--compute", "replay:/nonexistent/compute.json"], "give results/<run-id>/compute.json"),
    (["experiment", "--compute", "bogus"], "choose one of: real, replay, replay:FILE, gpt-7b-h100"),
    (["run", "--memory-budget", "lots"], "--memory-budget: memory budget 'lots': write bytes (e.g. 64MiB) or 1f1b+N"),
    (["experiment", "--memory-budget", "lots"], "--memory-budget: memory budget 'lots': write bytes"),
    (["experiment", "--memory-budgets", "1f1b+1,lots"], "--memory-budgets: memory budget 'lots': write bytes"),
    (["run", "--schedule", "1f1b,geopip"], "--schedule: unknown schedule 'geopip'; did you mean 'geopipe'?"),
    (["experiment", "--schedule", "geopip"], "did you mean 'geopipe'?"),
    (["experiment", "--focus-schedule", "torch-zvb"], "--focus-schedule: unknown schedule 'torch-zvb'; did you mean"),
    (["remote", "cycle", "lab.yaml", "--schedule", "geopip"], "did you mean 'geopipe'?"),
    (["run", "--microbatches", "0"], "must be at least 1"),
    (["run", "--width", "66"], "(--width, --heads"),
    (["run", "--dilation", "lots"], "--dilation 'lots': use off, auto or a factor such as 1.25"),
    (["experiment", "--dilation", "0.5"], "--dilation 0.5: a factor is at least 1 (1 is off)"),
    (["experiment", "--distances", "0,far"], "not a comma-separated list of numbers; write e.g. 0,500,1000"),
    (["experiment", "--transport", "ib"], "--transport: unknown 'ib'; give tcp, rdma or tcp,rdma"),
    (["experiment", "3dc-lin"], "did you mean '3dc-line'?"),
    (["link", "set", "dc-a", "dc-b", "--delay", "10"],
     "--delay 10: a bare number is ambiguous (milliseconds here, microseconds in tc(8)); write the unit: 10ms or 10us"),
    (["link", "set", "dc-a", "dc-b", "--jitter", "0.5"], "write the unit: 0.5ms or 0.5us"),
    (["link", "set", "dc-a", "dc-b", "--delay", "10parsecs"], "--delay: unknown time unit 'parsecs'"),
    (["link", "set", "dc-a", "dc-b", "--rate", "10Gbps"], "--rate: unknown rate unit 'gbps' in '10Gbps' (ambiguous"),
    (["link", "set", "dc-a", "dc-b", "--loss", "lots"], "--loss: cannot parse 'lots' as a fraction; write it like '0.1%'"),
    (["link", "set", "dc-a", "dc-b", "--delay", "10ms"], as_root("no testbed is up; bring one up with 'testbed up")),
    (["exec", "dc-a-h1"], "no command given; write: testbed exec dc-a-h1 -- CMD [ARGS...]"),
    (["exec", "dc-a-h1", "--"], "no command given; write: testbed exec dc-a-h1 -- CMD [ARGS...]"),
    (["exec", "dc-a-h1", "--", "true"], as_root("no running testbed has a node named 'dc-a-h1'; 'testbed status'")),
    (["down"], as_root("no testbed is up; bring one up with 'testbed up TOPOLOGY'")),
    (["down", "nope"], as_root("no testbed named 'nope' is up; 'testbed status' lists them")),
    (["verify"], as_root("no testbed is up; bring one up with 'testbed up TOPOLOGY'")),
    (["cli", "nope"], as_root("no testbed named 'nope' is up")),
    (["status", "nope"], "no testbed named 'nope' is up"),
    (["report", "nope", "--results", "/nonexistent"], "give a folder with summary.json"),
    (["remote", "preflight", "/nonexistent/lab.yaml"], "invalid inventory: /nonexistent/lab.yaml"),
]


@pytest.mark.parametrize(("argv", "says"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_each_error_path_is_one_line_that_names_the_fix(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                        says: str) -> None:
    code, lines = refusal(capsys, *argv)
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("testbed: "), lines
    assert says in lines[0]


def test_a_file_with_several_problems_lists_each_with_its_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "two.yaml"
    topo.write_text("name: two\ndatacenters: {dc-a: {hosts: 1}, dc-b: {hosts: 1}}\n"
                    "links: [{a: dc-a, b: dc-z, distance: 10parsecs}]\n")
    code, lines = refusal(capsys, "plan", str(topo))
    assert code == 2 and lines[0] == f"testbed: invalid topology {topo} (3 problems)"
    assert len(lines) == 4 and all(line.startswith(f"  {topo}: ") for line in lines[1:])
    said = "\n".join(lines[1:])
    # a link with an unknown end still has its other keys checked: every problem of the file at once
    assert "links[0].b: unknown datacenter 'dc-z'" in said and "links[0].distance: unknown distance unit" in said


def test_unit_errors_come_before_the_root_check(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert refusal(capsys, "link", "set", "dc-a", "dc-b", "--delay", "10parsecs")[1] == [
        "testbed: --delay: unknown time unit 'parsecs' in '10parsecs'; use s, ms, us or ns, e.g. '2.5ms'"]
    for command in cli.COMMANDS:
        argv = [command.name, *{"exec": ["h1", "--", "true"], "link": ["set", "a", "b", "--delay", "1ms"],
                                "remote": ["preflight", "lab.yaml"], "report": ["x"]}.get(command.name, [])]
        if command.needs_root:
            assert refusal(capsys, *argv) == (1, [f"testbed: 'testbed {command.name}' needs root (network namespaces); "
                                                  "run it with sudo"])


def test_in_a_child_process_too(tmp_path: Path) -> None:
    env = {**os.environ, "TESTBED_STATE_DIR": str(tmp_path)}
    for argv, says in (["plan", "3dc-lin"], "did you mean '3dc-line'?"), (
            ["link", "set", "dc-a", "dc-b", "--delay", "10"], "ambiguous"), (["exec", "dc-a-h1"], "no command given"):
        result = subprocess.run([sys.executable, "-m", "testbed", *argv], capture_output=True, text=True, cwd=REPO,
                                env=env, timeout=60)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("testbed: ") and says in result.stderr


def test_an_interrupt_says_what_was_removed_with_its_status(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(cli, "COMMANDS", tuple(dataclasses.replace(c, handler=interrupted) for c in cli.COMMANDS))
    assert refusal(capsys, "doctor") == (143, ["testbed: received SIGTERM; everything this command created was removed"])


def test_old_spellings_work_for_one_release_with_a_notice(capsys: pytest.CaptureFixture[str]) -> None:
    def spec(*argv: str) -> object:
        args = cli.build_parser().parse_args(["experiment", *argv])
        cli.check_experiment(args)
        return args.spec

    old = spec("--topology", "3dc-line", "--schedules", "1f1b,geopipe", "--focus-schedules", "", "--budgets", "1f1b+2",
               "--transports", "tcp")
    notices = capsys.readouterr().err.splitlines()
    assert len(notices) == 5 and all(n.startswith("testbed: --") and n.endswith(NOTICE) for n in notices)
    assert "testbed: --schedules is now spelled --schedule; " + NOTICE in notices
    new = spec("3dc-line", "--schedule", "1f1b,geopipe", "--focus-schedule", "", "--memory-budgets", "1f1b+2",
               "--transport", "tcp")
    assert capsys.readouterr().err == "" and old == new
    assert new.topology == "3dc-line" and new.schedules == ["1f1b", "geopipe"] and new.focus_schedules == []  # type: ignore[attr-defined]
    assert spec().topology == "2dc-1000km"  # type: ignore[attr-defined]
    with pytest.raises(cli.UsageError, match="two topologies given"):
        spec("4dc-ring", "--topology", "3dc-line")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices  # noqa: SLF001


def test_the_parser_root_check_and_usage_come_from_one_table() -> None:
    names = [c.name for c in cli.COMMANDS]
    assert list(_subparsers(cli.build_parser())) == names
    for command in cli.COMMANDS:
        assert f"  {command.name:<11} {command.summary}" in (cli.__doc__ or "")
        assert command.help.endswith("(needs root)") == command.needs_root
    assert {c.name for c in cli.COMMANDS if c.needs_root} == {"up", "down", "exec", "verify", "link", "run",
                                                                "experiment", "paper", "congestion", "cli"}
    assert len(inspect.getsourcelines(cli.build_parser)[0]) < 40


def test_every_help_has_defaults_help_for_each_option_and_an_example() -> None:
    parsers = _subparsers(cli.build_parser())
    for name, parser in parsers.items():
        assert "example:\n  " in (parser.epilog or ""), name
        for action in parser._actions:                                               # noqa: SLF001
            assert action.help, f"testbed {name} {action.option_strings or action.dest}: no help"
    run, up = (" ".join(parsers[name].format_help().split()) for name in ("run", "up"))
    assert "micro-batches per iteration (default: 8)" in run
    assert "(default: quick)" in up and "(default: 2dc-1000km)" in up
    assert "--json" in parsers["status"].format_help() and "print JSON" in parsers["status"].format_help()
    for command in ("run", "remote", "experiment"):
        schedule_help = parsers[command]._option_string_actions["--schedule"].help or ""       # noqa: SLF001
        assert all(s in schedule_help for s in (*SCHEDULES, *TORCH_SCHEDULES))
    assert "--schedules" not in parsers["experiment"].format_help()


PACKAGES = ("testbed", "workloads", "playbooks")


def _exception_classes() -> Iterator[tuple[str, str]]:
    """(module, class) of every class in the packages whose bases name an exception."""
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(b, ast.Name | ast.Attribute) and ast.unparse(b).split(".")[-1].endswith(
                            ("Error", "Exception", "Exceeded", "Deadlock", "Unavailable", "Refused", "Interrupted"))
                        for b in node.bases):
                    module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                    yield module, node.name


def test_every_exception_class_derives_from_the_one_root() -> None:
    found = list(_exception_classes())
    assert len(found) >= 20
    for module, name in found:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, TestbedError) or cls is Interrupted, f"{module}.{name} is not beneath TestbedError"
    assert not issubclass(Interrupted, Exception)                  # a signal passes `except Exception`
    assert TestbedError("no shaper", hint="install sch_netem").lines() == ["no shaper; install sch_netem"]


def test_no_error_is_re_raised_through_its_text_and_none_is_known_by_its_name() -> None:
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text()
            assert "(str(exc)) from" not in text, f"{path}: re-raises an error as another through str(exc)"
    assert "__name__ ==" not in (REPO / "testbed" / "cli.py").read_text().replace('__name__ == "__main__"', "")



def test_an_experiment_takes_a_token_budget_and_a_shape_and_derives_its_micro_batch_count() -> None:
    from testbed.experiment.records import ExperimentSpec
    from testbed.run.runner import RunError, RunOptions

    def spec(*argv: str) -> Any:
        args = cli.build_parser().parse_args(["experiment", "3dc-8stages", *argv])
        cli.check_experiment(args)
        return args.spec

    planned = spec("--compute", "llama2-13b-910b-tp8", "--tokens", "256Ki", "--shape", "2x2048", "--stages", "8")
    assert (planned.tokens, planned.shape, planned.microbatches) == (262144, [2, 2048], 64)
    assert ExperimentSpec.from_json(dataclasses.asdict(planned)) == planned      # as --resume reads it back
    per = RunOptions(schedules=["1f1b"]).tokens_per_microbatch()              # the real model's b x its sequence
    assert spec("--tokens", str(40 * per)).microbatches == 40
    with pytest.raises(RunError, match="not a whole number of micro-batches"):
        spec("--compute", "llama2-13b-910b-tp8", "--tokens", "1000", "--shape", "1x1024")
    with pytest.raises(RunError, match="--microbatch-counts"):
        spec("--compute", "llama2-13b-910b-tp8", "--tokens", "256Ki", "--microbatch-counts", "8,16")


def test_the_paper_command_takes_its_schedules_and_can_leave_out_the_real_run() -> None:
    def spec(*argv: str) -> Any:
        args = cli.build_parser().parse_args(["paper", *argv])
        cli.check_paper(args)
        return args.spec

    assert spec().schedules == ("1f1b", "1f1b-prefetch", "geopipe") and spec().real_beside is not None
    chosen = spec("--schedule", "1f1b,geopipe", "--no-real")
    assert chosen.schedules == ("1f1b", "geopipe") and chosen.real_beside is None
    with pytest.raises(cli.UsageError, match="not one the shape planner plans"):
        spec("--schedule", "gpipe")


def test_quick_keeps_every_experiment_option_the_user_gave() -> None:
    """`--quick` is quick's settings where the user gave no option; an option given beside it wins (it used to
    be dropped without a word)."""
    def spec(*argv: str) -> Any:
        args = cli.build_parser().parse_args(["experiment", "2dc-1000km", *argv])
        cli.check_experiment(args)
        return args.spec

    plain = spec("--quick")
    assert plain.distances_km == [0.0, 1000.0] and plain.schedules == ["1f1b", "geopipe"] and plain.microbatches == 8
    mine = spec("--quick", "--distances", "0,2000", "--schedule", "1f1b,1f1b-prefetch", "--microbatches", "16")
    assert mine.distances_km == [0.0, 2000.0] and mine.schedules == ["1f1b", "1f1b-prefetch"]
    assert mine.microbatches == 16 and mine.repetitions == 1 and mine.topology == "2dc-1000km"
