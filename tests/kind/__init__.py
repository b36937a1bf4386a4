"""The kind tier: docs/install.md's kind lines, run with `make test-kind` (tests/kind/lines.py)."""
