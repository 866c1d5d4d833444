"""Distributed training: SINGA's worker groups and server groups on top of the trainer.

Inside a worker group the workers are synchronous (`allreduce`: gradients averaged by
DistributedDataParallel; `localsgd`: replicas averaged every few steps; `partition`: a net split
by batch or by feature across the group); between
groups, and for separate server shards, the parameter server in `ps/` carries the updates.
"""
