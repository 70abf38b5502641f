"""Topology: the pure-data description of datacenters, hosts and OTN links (no kernel access here).

Owns the YAML loader, its validation errors and the JSON schema. May import: util.
"""

from testbed.topology.errors import Problem, TopologyError
from testbed.topology.loader import load_topology, parse_topology
from testbed.topology.model import Datacenter, DirectionSpec, Fabric, OtnLink, Topology

__all__ = [
    "Datacenter", "DirectionSpec", "Fabric", "OtnLink", "Problem", "Topology", "TopologyError",
    "load_topology", "parse_topology",
]
