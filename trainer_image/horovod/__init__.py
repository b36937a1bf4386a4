"""Horovod's PyTorch API on torch.distributed, so that a script written for Horovod
(`import horovod.torch as hvd`) runs unchanged in the trainer image, under kube-ddp's mpirun
(`launcher: mpi`) or its torchrun. Not Horovod: its last release (0.28.1, 2023) builds from
source against the torch it supports (up to 2.0), not the trainer's. docs/mpi.md, "Horovod
scripts", says what is covered."""
