"""Emulated multi-datacenter testbed for geo-distributed pipeline-parallel training.

Layers, lowest first; a package imports only from packages below it (tests/test_layers.py keeps it so):
errors -> util -> topology -> plan -> state -> backends -> probe -> shaping -> deploy -> check -> run -> experiment -> cli.
Topologies describe, plans decide, backends build, shapers delay, checks measure, runs train, experiments sweep.
`workloads/` (the training side) imports nothing from here.
"""
