"""RDMA messaging for the pipeline workers (pyverbs; imported only when --transport rdma runs)."""
