"""Whose status fields are whose (docs/design.md, "Who writes what"): `status.training` and
`status.rankRestart` are what the pods report; every other field is the operator's own. The
pods' account may write the whole status subresource, so a field of the operator's that differs
from what the operator last wrote was written by someone else: the operator's record wins, and
the job says which fields were overwritten."""

from __future__ import annotations

from typing import Any, Final

from kube_ddp.api import JobStatus

REPORTED: Final = {"training", "rank_restart"}


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
