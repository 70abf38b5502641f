"""Topology: the pure-data description of datacenters, hosts and OTN links (no kernel access here)."""

from testbed.topology.errors import Problem, TopologyError
from testbed.topology.loader import load_topology, parse_topology
from testbed.topology.model import Datacenter, Direction, Fabric, OtnLink, Topology

__all__ = [
    "Datacenter", "Direction", "Fabric", "OtnLink", "Problem", "Topology", "TopologyError",
    "load_topology", "parse_topology",
]
