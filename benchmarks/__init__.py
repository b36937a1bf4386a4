"""`make bench` / `python -m benchmarks [trainer|operator|all]`; results go to docs/BENCHMARKS.md.

Each benchmark is a module with `run(args) -> str` (its Markdown section): `trainer` and
`operator_bench`. __main__ runs the ones asked for and writes each section between its own
markers in the document, so each benchmark's figures are rewritten without touching the other's.
"""
