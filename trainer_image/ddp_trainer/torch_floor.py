"""The oldest torch the trainer runs on, said before it trains rather than failing after.

The oldest torch a shipped image carries: trainer_image/Dockerfile's CUDA base and Intel Gaudi
1.23's images, 2.9 both. tests/trainer/test_image_torch.py runs the pods' commands under each.
"""

from __future__ import annotations

import re
from typing import Final

OLDEST: Final = (2, 9)


def too_old(version: str) -> str | None:
    """What to say where torch `version` is older than OLDEST; None where it will do (or
    where the version names no release: a source build is let through)."""
    release = re.match(r"(\d+)\.(\d+)", version)
    if release is None or tuple(int(part) for part in release.groups()) >= OLDEST:
        return None
    oldest = ".".join(map(str, OLDEST))
    return (
        f"torch {version} is older than {oldest}, the oldest the trainer runs on: build the "
        f"image on a base with torch >= {oldest} (trainer_image/Dockerfile's BASE_IMAGE)"
    )
