"""Run: place the stages on hosts (placement), launch one pipeline worker per stage host, supervise them and
watch the host (util.hostload), collect their rank traces into summary.json (metrics, summary) and a Chrome trace
(runner). May import: util .. check, and from `workloads` what describes a run without running it (records,
memory budgets, the schedules' names and stage layouts).
"""
