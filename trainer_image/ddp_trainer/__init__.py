"""ddp_trainer: the generic PyTorch DDP training entrypoint (`python -m ddp_trainer`)."""

__version__ = "0.1.0"
