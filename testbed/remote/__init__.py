"""Runs on several real machines over SSH: the inventory, the connections, the agent each machine runs."""
