"""Fixtures of the unit tier."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def write_job(tmp_path: Path):
    def write(text: str, name: str = "job.yaml") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write
