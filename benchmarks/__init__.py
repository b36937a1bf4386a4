"""`make bench` / `python -m benchmarks [trainer|operator|all]`; results go to docs/BENCHMARKS.md.

Each benchmark is a module with `NAME` and `run(args) -> str` (its Markdown section); __main__
runs the ones asked for and writes each section between its own markers in the document, so
the trainer's and the operator's figures live side by side without overwriting each other.
"""
