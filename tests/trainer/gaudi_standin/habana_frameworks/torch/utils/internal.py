"""`is_lazy` as Intel Gaudi release 1.19 has it: PT_HPU_LAZY_MODE, lazy when unset."""

from __future__ import annotations

import os


def is_lazy() -> bool:
    return os.getenv("PT_HPU_LAZY_MODE", "1") != "0"
