"""Text that pods wrote, as a terminal may print it: a worker's log line, a status message or an
Event's words are any program's output, and a control character in them (an escape sequence
that moves the cursor, retitles the window, rewrites what was printed) would act on the user's
terminal. What is printed keeps tabs; every other C0 and C1 control character is dropped."""

from __future__ import annotations

import re
from typing import Final

# C0 but tab and newline, DEL, C1. A newline stays where whole texts are printed (describe).
_CONTROL: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` without its control characters (tabs and newlines kept)."""
    return _CONTROL.sub("", text)


def printable_line(text: str) -> str:
    """One line of `text`, its newlines too taken out."""
    return printable(text).replace("\n", " ")
