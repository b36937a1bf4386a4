"""A stand-in for Intel Gaudi's `habana_frameworks`, put on PYTHONPATH by the trainer tier so the
trainer's Gaudi imports run on CPU. It has only the names the trainer uses: the `hccl` process
group (`torch.distributed.hccl`), `mark_step` (`torch.core`) and `is_lazy`
(`torch.utils.internal`). No device: the runs that use it pass `--device cpu`."""
