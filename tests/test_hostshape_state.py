"""The remote agent's state file (testbed/remote/hostshape.py Installed): typed rules and delay-line files,
written and read back as they are, and an older agent's positional state still removable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.remote import hostshape
from testbed.remote.hostshape import DelayLineFiles, Installed, IptablesRule


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(hostshape, "STATE_DIR", tmp_path)
    return tmp_path


def test_state_round_trips_typed(state_dir: Path) -> None:
    rule = IptablesRule("raw", "PREROUTING", ("-i", "eth1", "-s", "10.0.0.2/32", "-j", "NFQUEUE", "--queue-num", "1"))
    files = DelayLineFiles.in_folder(state_dir / "tb", "h1")
    Installed("tb", "h1", "eth1", "delayline", 2, spec="s.json", rules=[rule], daemon_pid=42, delay_line=files,
              rxe=["rxe_tb_0"]).save()
    back = Installed.load("tb", "h1")
    assert back is not None and back.rules == [rule] and back.delay_line == files and back.rxe == ["rxe_tb_0"]
    assert rule.args("-D") == ["-t", "raw", "-D", "PREROUTING", "-i", "eth1", "-s", "10.0.0.2/32", "-j", "NFQUEUE",
                               "--queue-num", "1"]
    assert files.stats.endswith("h1.delayline.stats") and files.config.endswith("h1.delayline.json")


def test_an_older_agents_positional_state_is_read(state_dir: Path) -> None:
    path = Installed.path("tb", "h1")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"testbed": "tb", "host": "h1", "nic": "eth1", "mode": "delayline", "classes": 1,
                                "spec": "", "rules": [["-t", "raw", "PREROUTING", "-i", "eth1", "-j", "NFQUEUE"]],
                                "daemon_pid": 7, "files": ["c.json", "s.stats", "s.status", "l.log"], "rxe": []}))
    back = Installed.load("tb", "h1")
    assert back is not None and back.rules == [IptablesRule("raw", "PREROUTING", ("-i", "eth1", "-j", "NFQUEUE"))]
    assert back.delay_line == DelayLineFiles("c.json", "s.stats", "s.status", "l.log")


def test_netem_state_has_no_delay_line(state_dir: Path) -> None:
    Installed("tb", "h2", "eth1", "netem", 1).save()
    back = Installed.load("tb", "h2")
    assert back is not None and back.delay_line is None and back.rules == []


def test_a_state_file_survives_its_folder_going_with_another_machines_removal(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Machines that share one filesystem (the test lab's namespaces) share the testbed's state folder, which goes
    with the last machine's state: when it goes between the mkdir and the write, the write is tried again."""
    import os
    import shutil

    target = tmp_path / "tb" / "dc-c-h1.spec.json"
    real_replace, taken = os.replace, []

    def replace_after_the_folder_went(src: str, dst: str) -> None:
        if not taken:
            taken.append(True)
            shutil.rmtree(target.parent)          # another machine's `remove` took the (then empty) folder
        real_replace(src, dst)

    monkeypatch.setattr(hostshape.os, "replace", replace_after_the_folder_went)
    hostshape.write_state_file(target, '{"ok": 1}')
    assert taken and target.read_text() == '{"ok": 1}'
    assert [p.name for p in target.parent.iterdir()] == [target.name]
