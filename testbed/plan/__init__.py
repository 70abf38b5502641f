"""Plan: what a backend must create (addresses, routes, veths, per-direction link shapes). Pure functions."""

from testbed.plan.builder import build_plan
from testbed.plan.model import Interface, LinkShape, Node, Plan, Route, Veth

__all__ = ["Interface", "LinkShape", "Node", "Plan", "Route", "Veth", "build_plan"]
