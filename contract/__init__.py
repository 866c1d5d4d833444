"""What crosses process boundaries: the settings every process reads, and (contract.records)
the Redis keys, stream records, allocation record, exit codes and time-to-lives that the API,
the scheduler, node agents and workers exchange. Imports no other package of the project, so
the client (sdk) and the server side (api, scheduler, workers) can both depend on it."""
