"""Emulated multi-datacenter testbed for geo-distributed pipeline-parallel training."""
