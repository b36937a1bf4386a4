"""The Pod Security Standards in the pure core (kube_ddp.podsecurity) and the defaults that let
kube-ddp's pods meet `restricted`. tests/cluster/test_pod_security.py compares the verdicts
with the API server's PodSecurity admission."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kube_ddp import podsecurity
from kube_ddp.builders import BuildSettings
from kube_ddp.cli import EXIT_POD_SECURITY, main
from kube_ddp.jobfile import read_jobs
from kube_ddp.launchers import build_children
from tests.unit.support import make_job

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "manifests" / "examples").rglob("*.yaml"))
JOB_EXAMPLES = [p for p in EXAMPLES if "kind: DDPTrainingJob" in p.read_text()]
MPI = {"launcher": "mpi", "mpi": {"socketsPerNode": 1, "coresPerProcess": 1}}
GAUDI = {"accelerator": {"type": "gaudi", "perNode": 8}}


def pods(**spec: Any) -> list[podsecurity.RenderedPod]:
    return podsecurity.rendered_pods(build_children(make_job(**spec), 0, BuildSettings()))


def reasons(pod: podsecurity.RenderedPod, level: podsecurity.Level) -> list[str]:
    return [v.reason for v in podsecurity.violations(pod.metadata, pod.spec, level)]


@pytest.mark.parametrize("spec", [{"nodes": 2}, {"nodes": 2, **MPI}], ids=["torchrun", "mpi"])
def test_kube_ddps_pods_meet_restricted_by_default(spec: dict[str, Any]) -> None:
    rendered = pods(**spec)
    assert len(rendered) == 2  # two workers, or the launcher's and the workers' templates
    for pod in rendered:
        assert reasons(pod, "restricted") == [], pod.name


def test_a_gaudi_worker_meets_privileged_only_and_its_launcher_restricted() -> None:
    rendered = {p.name.rsplit("-", 1)[-1]: p for p in pods(nodes=2, **MPI, **GAUDI)}
    worker = rendered["worker"]
    assert reasons(worker, "baseline") == ["host namespaces", "non-default capabilities"]
    assert podsecurity.level_met(worker.metadata, worker.spec) == "privileged"
    launcher = rendered["launcher"]
    assert podsecurity.level_met(launcher.metadata, launcher.spec) == "restricted"


def test_the_users_security_context_is_merged_over_the_defaults() -> None:
    template = {
        "securityContext": {"runAsUser": 2000, "seccompProfile": {"type": "Localhost",
                                                                  "localhostProfile": "p.json"}},
        "container": {"securityContext": {"readOnlyRootFilesystem": True,
                                          "capabilities": {"add": ["NET_BIND_SERVICE"]}}},
        "initContainers": [{"name": "fetch", "image": "busybox"}],
    }  # fmt: skip
    (pod, _) = pods(nodes=2, template=template)
    context = pod.spec["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 2000
    assert context["seccompProfile"]["type"] == "Localhost"
    trainer = pod.spec["containers"][0]["securityContext"]
    assert trainer["readOnlyRootFilesystem"] is True
    assert trainer["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    assert pod.spec["initContainers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert reasons(pod, "restricted") == []


def test_a_template_that_runs_as_root_gets_no_run_as_non_root_and_meets_baseline() -> None:
    """runAsNonRoot with runAsUser 0 would stop the container: root is the user's choice."""
    (pod, _) = pods(nodes=2, template={"securityContext": {"runAsUser": 0}})
    assert "runAsNonRoot" not in pod.spec["securityContext"]
    assert reasons(pod, "restricted") == ["runAsNonRoot != true", "runAsUser=0"]
    assert podsecurity.level_met(pod.metadata, pod.spec) == "baseline"


# One pod that breaks each check, made from a restricted pod: every rule of the table is tried.
BREAKS: dict[str, tuple[str, Any]] = {
    "windowsHostProcess": ("spec.securityContext.windowsOptions", {"hostProcess": True}),
    "hostNamespaces": ("spec.hostPID", True),
    "privileged": ("container.securityContext.privileged", True),
    "capabilities_baseline": ("container.securityContext.capabilities.add", ["NET_ADMIN"]),
    "hostPathVolumes": ("spec.volumes", [{"name": "h", "hostPath": {"path": "/x"}}]),
    "hostPorts": ("container.ports", [{"containerPort": 80, "hostPort": 80}]),
    "hostProbesAndHostLifecycle": ("container.readinessProbe",
                                   {"httpGet": {"host": "1.2.3.4", "port": 80}}),
    "appArmorProfile": ("container.securityContext.appArmorProfile", {"type": "Unconfined"}),
    "seLinuxOptions": ("spec.securityContext.seLinuxOptions", {"type": "spc_t"}),
    "procMount": ("container.securityContext.procMount", "Unmasked"),
    "seccompProfile_baseline": ("spec.securityContext.seccompProfile", {"type": "Unconfined"}),
    "sysctls": ("spec.securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
    "restrictedVolumes": ("spec.volumes", [{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
    "allowPrivilegeEscalation": ("container.securityContext.allowPrivilegeEscalation", True),
    "runAsNonRoot": ("spec.securityContext.runAsNonRoot", False),
    "runAsUser": ("container.securityContext.runAsUser", 0),
    "seccompProfile_restricted": ("spec.securityContext.seccompProfile", None),
    "capabilities_restricted": ("container.securityContext.capabilities.drop", []),
    "procMount_restricted": ("container.securityContext.procMount", "Unmasked"),
}  # fmt: skip


def broken(path: str, value: Any) -> podsecurity.RenderedPod:
    (pod, _) = pods(nodes=2)
    spec = copy.deepcopy(pod.spec)
    where, *keys = path.split(".")
    target = spec if where == "spec" else spec["containers"][0]
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    if value is None:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return podsecurity.RenderedPod(pod.name, pod.metadata, spec)


def test_every_check_of_the_table_has_a_breaking_pod() -> None:
    assert set(BREAKS) == {c.id for c in podsecurity.CHECKS}


@pytest.mark.parametrize("check", podsecurity.CHECKS, ids=lambda c: c.id)
def test_each_check_refuses_the_pod_that_breaks_it(check: podsecurity.Check) -> None:
    pod = broken(*BREAKS[check.id])
    assert check.find(pod.metadata, pod.spec) is not None
    for level in podsecurity.LEVELS:
        if check in podsecurity.checks_of(level):
            assert check.reason in reasons(pod, level)
    assert reasons(pod, "restricted")  # by this check, or the stricter one that replaces it
    if check.level == "restricted" and check.replaces is None:
        assert reasons(pod, "baseline") == []
    assert reasons(pod, "privileged") == []


def test_a_user_namespaced_pod_may_run_as_root_under_restricted() -> None:
    pod = broken("spec.securityContext.runAsUser", 0)
    assert "runAsUser=0" in reasons(pod, "restricted")
    pod.spec["hostUsers"] = False
    assert "runAsUser=0" not in reasons(pod, "restricted")


@pytest.mark.parametrize("example", JOB_EXAMPLES, ids=lambda p: p.name)
def test_render_says_which_level_each_example_meets(
    example: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gaudi = any(j.spec.accelerator.type == "gaudi" for j in read_jobs(str(example), None))
    assert main(["render", str(example)]) == 0
    said = capsys.readouterr().err
    if gaudi:
        assert "meet the privileged Pod Security Standard, not baseline: host namespaces" in said
        assert main(["render", str(example), "--pod-security", "baseline"]) == EXIT_POD_SECURITY
        out, err = capsys.readouterr()
        assert out == ""
        assert 'gaudi-resnet-worker violates PodSecurity "baseline:latest": host namespaces' in err
        assert main(["render", str(example), "--pod-security", "privileged"]) == 0
    else:
        assert "meet the restricted Pod Security Standard" in said
        assert main(["render", str(example), "--pod-security", "restricted"]) == 0


def test_an_init_container_that_runs_as_root_drops_run_as_non_root_too() -> None:
    """A root init container (a chown before training) would be stopped by runAsNonRoot."""
    init = {"name": "chown", "image": "busybox", "securityContext": {"runAsUser": 0}}
    (pod, _) = pods(nodes=2, template={"initContainers": [init]})
    assert "runAsNonRoot" not in pod.spec["securityContext"]
    assert pod.spec["initContainers"][0]["securityContext"]["runAsUser"] == 0
    assert pod.spec["initContainers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
