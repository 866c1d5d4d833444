"""The cluster harness that tests and benchmarks share: `local_cluster` (a job's processes on
this machine without the service: workers and server shards as the node agent would start
them), `service_cluster` (the service's own processes: node agents, a scheduler, a Redis and
a SQL store), `load` (many users' jobs at once against a running stack) and `watched_workers`
(training processes watched from outside for their memory). None is part of the platform; all
run its real code. A test imports no benchmark: what the two share lives here."""
