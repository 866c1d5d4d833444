"""The cluster harness that tests and benchmarks share: `local_cluster` (a job's processes on
this machine without the service: workers and server shards as the node agent would start
them) and `service_cluster` (the service's own processes: node agents, a scheduler, a Redis and
a SQL store). Neither is part of the platform; both run its real code."""
