"""The README's quick start, walked for real: its commands are read from README.md
(tests/e2e/quickstart.py); the `operator` fixture has run its `helm install`, and this test
runs the rest on the real node until the job Succeeds. The job file is the example as
shipped, with only what the platform must add for its pods to reach the real node and run
the repository's code (tests/e2e/platform.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.support import REPO
from tests.e2e import quickstart
from tests.e2e.platform import Platform

KUBECTL_TIMEOUT_S = 900  # the longest `--timeout` the quick start may give a kubectl wait


def as_the_platform_runs_it(platform: Platform, path: Path, out: Path) -> Path:
    documents: list[dict[str, Any]] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for document in documents:
        document["spec"] = platform.job_spec(document["spec"])
    out.write_text(yaml.safe_dump_all(documents))
    return out


def test_the_readmes_quick_start_succeeds(
    platform: Platform, operator: dict[str, Any], namespace_e2e: str, tmp_path: Path
) -> None:
    commands = [c for c in quickstart.quick_start_commands() if c[0] != "helm"]
    assert [c[:2] for c in commands] == [
        ["kubectl", "apply"],
        ["kubectl", "wait"],
        ["kubectl", "get"],
    ], commands
    said = []
    for command in commands:
        args = list(command[1:])
        if args[:2] == ["apply", "-f"]:
            args[2] = str(as_the_platform_runs_it(platform, REPO / args[2], tmp_path / "job.yaml"))
        done = subprocess.run(
            [
                str(platform.cluster.bin_dir / "kubectl"),
                f"--kubeconfig={platform.cluster.kubeconfig}",
                f"--namespace={namespace_e2e}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_S,
            check=False,
        )
        said.append(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, "\n".join(said)
    header, row = said[-1].splitlines()[1:3]
    assert header.split()[:2] == ["NAME", "PHASE"]
    assert row.split()[:2] == ["digits", "Succeeded"], "\n".join(said)
