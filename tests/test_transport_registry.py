"""One transport registry (workloads/records.py: TRANSPORTS) that one machine and several choose from."""

from __future__ import annotations

import ast
from pathlib import Path

from testbed.run.transport import CHOICES, TransportChoice
from workloads.records import RDMA, TCP, TRANSPORTS

ROOT = Path(__file__).resolve().parent.parent


def test_every_transport_is_a_choice_and_knows_how_messages_move() -> None:
    assert set(TRANSPORTS) | {"auto"} == set(CHOICES)
    assert TransportChoice(TCP.key, "").kind.receiver_driven and not TransportChoice(RDMA.key, "").kind.receiver_driven


def test_no_module_spells_a_transports_label_again() -> None:
    """'gloo-tcp' and 'rdma-rc' are written once, in the registry; elsewhere they are TCP.label, RDMA.label."""
    labels = {t.label for t in TRANSPORTS.values()}
    found = []
    for folder in ("testbed", "workloads", "playbooks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "workloads" / "records.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in labels:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found
