"""Plan: what a backend must create (addresses, routes, veths, per-direction link shapes). Pure functions.

Owns the typed `Plan` and its JSON form (the state file and results/*/plan.json). May import: util, topology.
"""

from testbed.plan.builder import build_plan
from testbed.plan.model import Interface, LinkDirection, Node, Plan, Route, Veth

__all__ = ["Interface", "LinkDirection", "Node", "Plan", "Route", "Veth", "build_plan"]
