"""Training workloads run across the emulated datacenters (pipeline-parallel GPT: see issue 4)."""
