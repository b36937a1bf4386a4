"""The soak (tests/cluster/soak.py) in its short form: a few minutes, every fault kind at least
once (a Kueue preemption among them), from a new seed each run, as `make soak`'s long form
(SOAK_MINUTES, SOAK_JOBS) draws one: a seed nobody tuned the checks to. The seed is printed,
and a failure starts with it; SOAK_SEED replays its faults."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cluster.soak import Soak, settings_from_env
from tests.cluster.support import IN_CI, Cluster


def test_faults_at_random_lose_nothing(
    cluster: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    settings = settings_from_env(default_minutes=3, default_jobs=10)
    print(f"soak seed {settings.seed}: SOAK_SEED={settings.seed} replays these faults")
    with_kueue = os.geteuid() == 0 or IN_CI  # Kueue out of cluster needs root; CI fails loudly
    if not with_kueue:
        print("soak without Kueue (it needs root): its preemptions meet nothing")
    soak = Soak(cluster, namespace, settings, tmp_path, with_kueue)
    try:
        soak.run()
    finally:
        print(soak.summary())
        if results := os.environ.get("SOAK_RESULTS"):
            Path(results).write_text(json.dumps(soak.results(), indent=1) + "\n")
    stories = [f"{v.at:.0f}s {v.job}: {v.what}\n{soak.history(v.job)}" for v in soak.violations]
    assert not soak.violations, f"seed {settings.seed}\n" + "\n\n".join(stories)[-20000:]
