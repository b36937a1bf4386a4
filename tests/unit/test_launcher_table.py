"""Each launcher in every table keyed by its name: what it builds (`kube_ddp.launchers`), how
its status is decided (`kube_ddp.status.PATHS`) and what a job may name (`spec.launcher`)."""

from __future__ import annotations

from typing import get_args

from kube_ddp.api import DDPTrainingJobSpec
from kube_ddp.launchers import LAUNCHERS
from kube_ddp.status import PATHS


def test_every_launcher_has_a_status_path_and_every_path_a_launcher() -> None:
    assert set(PATHS) == set(LAUNCHERS)


def test_every_launcher_a_job_may_name_is_in_both_tables() -> None:
    named = set(get_args(DDPTrainingJobSpec.model_fields["launcher"].annotation))
    assert named == set(LAUNCHERS) == set(PATHS)
