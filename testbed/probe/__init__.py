"""Probes: measure a running testbed from inside its namespaces (ICMP reach, one-way/round-trip latency,
TCP goodput). May import: util, plan, state, backends.
"""
