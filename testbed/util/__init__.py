"""Leaf helpers every layer may use: units (parse/format), plain-text tables, project paths, processes by PID.

Imports nothing from the rest of `testbed` but the errors' root (`testbed.errors`).
"""
