"""`kube-ddp run --local`: the same job file on one machine, run by the operator's own core.

Its modules and how they fit: docs/design.md ("Operator modules", "Local runs").
"""
