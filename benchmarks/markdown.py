"""docs/BENCHMARKS.md: one section per benchmark, each between its own markers."""

from __future__ import annotations

from pathlib import Path

TITLE = (
    "# Benchmarks\n\n"
    "Written by `make bench` (`python -m benchmarks`), each section by its own benchmark.\n"
)


def replace_section(document: Path, name: str, body: str) -> None:
    """Put `body` between `<!-- name:begin -->` and `<!-- name:end -->`, appending if absent."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = document.read_text() if document.exists() else TITLE
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        after = rest.split(end, 1)[1]
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    document.parent.mkdir(parents=True, exist_ok=True)
    document.write_text(text)
