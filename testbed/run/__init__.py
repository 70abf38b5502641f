"""Run: launch one pipeline worker per host namespace, supervise them, collect their rank traces into
summary.json and a Chrome trace. May import: util .. check, and `workloads.records` (the typed worker
configuration and rank traces that cross the process boundary).
"""
