"""Parameter-server shards on Redis: slicing, wire format, shard processes and the worker client."""
