"""Experiment: sweeps of runs (distance, repetitions, memory budget, rate, micro-batches) on one testbed,
the analytical model beside each point, and the report and plots. May import: util .. run, and `workloads`
(schedules and the simulator, for the model).
"""
