"""The e2e tier: real pods on a real node (tests/e2e/conftest.py)."""
