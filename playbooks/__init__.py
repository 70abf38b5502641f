"""Fabric playbooks: the multi-host cycle (playbooks.cycle) behind `testbed remote`."""
