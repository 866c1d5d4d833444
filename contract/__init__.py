"""What crosses process boundaries, one module per wire: the settings every process reads
(settings.py), the Redis keys and their time-to-lives (keys.py), a job's stream records
(stream.py), the allocation record with its states and exit codes (allocation.py), a node's
registration (nodes.py), the announcements of new work (announcements.py), the fork server's
words (fork_server.py), the artifact directory's layout (rundir.py), a folder of data shards
(shards.py) and what an uploaded .npz or .csv holds (inventory.py); the records are read and
written through one codec (codec.py). Imports no other
package of the project, so the client (trainyard) and the server side (api, scheduler, workers)
can both depend on it."""
