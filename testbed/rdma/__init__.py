"""RDMA between emulated hosts: whether the kernel runs rdma_rxe inside namespaces (support), SoftRoCE devices
per host at bring-up (softroce) and the RDMA probe that verify runs (probe). May import util, topology, plan,
state and backends (and workloads.rdma, the endpoint the workers use)."""
