"""Training workloads run across the emulated datacenters: a small GPT split into pipeline stages (model,
data), schedules as data (schedule) with a dry-run simulator (simulate) and GeoPipe's whole-pipeline plan
(sizing), in-flight memory and budgets (memory), the executor and transports that run them, the uncontended
reference compute (reference), and the worker process (worker, records). Imports nothing from `testbed`."""
