"""docs/BENCHMARKS.md: one section per benchmark, each between its own markers, and beside it
in docs/ each section's raw results (`benchmarks-<section>.json`), written with the section."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1] / "docs"
DOCUMENT = DOCS / "BENCHMARKS.md"
TITLE = (
    "# Benchmarks\n\n"
    "Written by `make bench` (`python -m benchmarks`), each section by its own benchmark.\n"
)


@dataclass(frozen=True)
class Section:
    """A section's markdown and the raw results it was written from: what its prose and
    tables quote, so they can be checked and drawn again."""

    text: str
    raw: Mapping[str, Any] = field(default_factory=dict)


def raw_path(name: str, document: Path = DOCUMENT) -> Path:
    """Where section `name` keeps its raw results: beside `document`."""
    return document.parent / f"benchmarks-{name}.json"


def raw_note(name: str) -> str:
    """The sentence by which section `name` says where its raw results are."""
    return f"Raw results: `{raw_path(name).relative_to(DOCS.parent)}`."


def write_section(document: Path, name: str, section: Section) -> None:
    """The section's text into `document`, its raw results beside it (small, indent=1)."""
    replace_section(document, name, section.text)
    raw_path(name, document).write_text(json.dumps(section.raw, indent=1) + "\n")


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
