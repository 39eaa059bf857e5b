"""The training core shared by every program: setup, step, loop, preemption, optimizers, sharding,
checkpoints, the workdir, metric writers, FLOPs."""
