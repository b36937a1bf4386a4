"""Whose status fields are whose (docs/design.md, "Who writes what"): `status.training` and
`status.rankRestart` are what the pods report; every other field is the operator's own. The
pods' account may write the whole status subresource, so a field of the operator's that differs
from what the operator last wrote was written by someone else: the operator's record wins, and
the job says which fields were overwritten."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from kube_ddp.api import JobStatus

REPORTED: Final = {"training", "rank_restart"}
REPORTED_KEYS: Final = {"training", "rankRestart"}


def read_status(raw: object) -> tuple[JobStatus, dict[str, str]]:
    """The status as read, less each top-level field that is not valid (a pod may have written
    it: a number out of range, a time with no zone), and why each was dropped, by field."""
    fields = dict(raw) if isinstance(raw, Mapping) else {}
    readable = isinstance(raw, Mapping) or raw is None
    dropped: dict[str, str] = {} if readable else {"": "status: not an object"}
    while True:
        try:
            return JobStatus.model_validate(fields), dropped
        except ValidationError as error:
            bad: dict[str, str] = {}
            for e in error.errors():
                top = str(e["loc"][0]) if e["loc"] else ""
                where = ".".join(str(part) for part in e["loc"])
                why = str(e["msg"]).removeprefix("Value error, ")
                bad.setdefault(top, f"status.{where}: {why}")
            if "" in bad or not bad.keys() & fields.keys():  # not one field's fault
                return JobStatus(), {**dropped, **{k: f"status.{k}: unreadable" for k in fields}}
            for top, why in bad.items():
                fields.pop(top, None)
                dropped[top] = why


MESSAGE_LENGTH: Final = 1024  # an Event's message stays readable, however many fields


def ignored_message(dropped: Mapping[str, str]) -> str:
    reasons = "; ".join(dropped[k] for k in sorted(dropped))
    return f"ignored, not valid: {reasons}"[:MESSAGE_LENGTH]


def owned_fields(status: JobStatus) -> dict[str, Any]:
    """The status fields the operator writes, as written (camelCase, no nulls)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=REPORTED)


def restore_owned(read: JobStatus, written: JobStatus) -> tuple[JobStatus, list[str]]:
    """`read` with the operator's fields as it last wrote them (`written`), and the names of
    those someone else changed since (none: `read` itself)."""
    found, ours = owned_fields(read), owned_fields(written)
    changed = sorted(k for k in found.keys() | ours.keys() if found.get(k) != ours.get(k))
    if not changed:
        return read, []
    reports = {name: getattr(read, name) for name in REPORTED}
    return written.model_copy(update=reports), changed


def overwritten_message(changed: list[str]) -> str:
    fields = ", ".join(f"status.{name}" for name in changed)
    return (
        f"{fields} changed by someone other than the operator: restored (pods may report "
        "only status.training and status.rankRestart)"
    )
