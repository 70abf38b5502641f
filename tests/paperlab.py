"""An inventory of three machines that exist only on paper (documentation addresses, a key file that is never
read): for tests of the remote wing's logic that open no SSH connection."""

from __future__ import annotations

from pathlib import Path

LAB_TOPOLOGY = Path(__file__).parent / "fixtures" / "multihost" / "3dc-lab.yaml"


def paper_inventory(tmp_path: Path, dc_b: str = "address: 192.0.2.2, data_address: 10.9.0.2",
                    dc_c: str = "address: 192.0.2.3, data_address: 10.9.0.3") -> Path:
    """tmp_path/lab.yaml over the 3dc-lab topology; `dc_b`/`dc_c` are those hosts' YAML keys."""
    (tmp_path / "id_ed25519").write_text("not read\n")
    (tmp_path / "known_hosts").write_text("")
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(f"""
topology: {LAB_TOPOLOGY}
known_hosts: known_hosts
defaults: {{user: root, key: id_ed25519, nic: data0}}
hosts:
  dc-a-h1: {{address: 192.0.2.1, data_address: 10.9.0.1}}
  dc-b-h1: {{{dc_b}}}
  dc-c-h1: {{{dc_c}}}
""")
    return inventory
