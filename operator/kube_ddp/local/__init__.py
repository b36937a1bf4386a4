"""`kube-ddp run --local`: the same job file on one machine, run by the operator's own core.

plan (job -> local processes), processes (a process as a pod), endpoint (the trainer's progress
reports), console (what a person sees), runner (the loop around `status.decide`), command (the
CLI subcommand).
"""
