"""The Kubernetes Pod Security Standards, checked on the pods kube-ddp renders.

One table of rules (`CHECKS`), each the check of the API server's PodSecurity admission
(k8s.io/pod-security-admission, `policy/check_*.go`) as it stands for the Kubernetes version
the project pins (1.36, the `latest` policy version): its id, its level, the reason the server
names when it refuses a pod, and what the check finds. A level's checks are its own and those
of the levels below it, except where a stricter check replaces a looser one (`replaces`).
`kube-ddp render --pod-security LEVEL` and the cluster test that compares it with the server
use this table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from kube_ddp import names
from kube_ddp.api import Obj

Level = Literal["privileged", "baseline", "restricted"]
LEVELS: tuple[Level, ...] = ("privileged", "baseline", "restricted")  # loosest first

# Capabilities a baseline pod may add (the container runtimes' defaults).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    }
)  # fmt: skip
RESTRICTED_VOLUME_KINDS = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
        "persistentVolumeClaim", "projected", "secret",
    }
)  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION = "container.seccomp.security.alpha.kubernetes.io/"


# --- reading a pod spec ------------------------------------------------------------------------


def _containers(spec: Obj) -> Iterator[Obj]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _context(obj: Obj) -> Obj:
    return obj.get("securityContext") or {}


def _quoted(values: Any) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _names(containers: list[Obj]) -> str:
    word = "container" if len(containers) == 1 else "containers"
    return f"{word} {_quoted(c['name'] for c in containers)}"


def _user_namespaced(spec: Obj) -> bool:
    """hostUsers: false relaxes the user checks (the pod's root is not the node's)."""
    return spec.get("hostUsers") is False


def _explicit_or_implicit(
    spec: Obj, key: str, good: Callable[[Any], bool]
) -> tuple[bool, list[Obj], list[Obj]]:
    """For a setting the pod or every container must set well: (the pod set it badly,
    containers that set it badly, containers that inherit no good pod value)."""
    pod_value = _context(spec).get(key)
    pod_bad = pod_value is not None and not good(pod_value)
    pod_good = pod_value is not None and good(pod_value)
    explicit: list[Obj] = []
    implicit: list[Obj] = []
    for container in _containers(spec):
        value = _context(container).get(key)
        if value is not None and not good(value):
            explicit.append(container)
        elif value is None and not pod_good:
            implicit.append(container)
    return pod_bad, explicit, implicit


# --- the checks (detail of the refusal, or None when the pod passes) ---------------------------


def _host_process(meta: Obj, spec: Obj) -> str | None:
    def sets_it(obj: Obj) -> bool:
        return bool((_context(obj).get("windowsOptions") or {}).get("hostProcess"))

    bad = [c for c in _containers(spec) if sets_it(c)]
    setters = (["pod"] if sets_it(spec) else []) + ([_names(bad)] if bad else [])
    if not setters:
        return None
    return " and ".join(setters) + " must not set securityContext.windowsOptions.hostProcess=true"


def _host_namespaces(meta: Obj, spec: Obj) -> str | None:
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    return ", ".join(found) or None


def _privileged(meta: Obj, spec: Obj) -> str | None:
    bad = [c for c in _containers(spec) if _context(c).get("privileged")]
    return f"{_names(bad)} must not set securityContext.privileged=true" if bad else None


def _added(container: Obj) -> list[str]:
    return list((_context(container).get("capabilities") or {}).get("add") or [])


def _capabilities_baseline(meta: Obj, spec: Obj) -> str | None:
    bad = [c for c in _containers(spec) if set(_added(c)) - BASELINE_CAPABILITIES]
    if not bad:
        return None
    extra = sorted({a for c in bad for a in _added(c)} - BASELINE_CAPABILITIES)
    return f"{_names(bad)} must not include {_quoted(extra)} in securityContext.capabilities.add"


def _host_path_volumes(meta: Obj, spec: Obj) -> str | None:
    bad = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if not bad:
        return None
    return f"{'volume' if len(bad) == 1 else 'volumes'} {_quoted(bad)}"


def _host_ports(meta: Obj, spec: Obj) -> str | None:
    bad = [c for c in _containers(spec) if any(p.get("hostPort") for p in c.get("ports") or [])]
    if not bad:
        return None
    ports = sorted({str(p["hostPort"]) for c in bad for p in c["ports"] if p.get("hostPort")})
    return f"{_names(bad)} {'uses' if len(bad) == 1 else 'use'} hostPort {', '.join(ports)}"


def _probe_hosts(container: Obj) -> list[str]:
    handlers = [container.get(k) or {} for k in ("livenessProbe", "readinessProbe", "startupProbe")]
    lifecycle = container.get("lifecycle") or {}
    handlers += [lifecycle.get("postStart") or {}, lifecycle.get("preStop") or {}]
    return [
        h[kind]["host"] for h in handlers for kind in ("httpGet", "tcpSocket")
        if (h.get(kind) or {}).get("host")
    ]  # fmt: skip


def _probe_and_lifecycle_hosts(meta: Obj, spec: Obj) -> str | None:
    bad = [c for c in _containers(spec) if _probe_hosts(c)]
    if not bad:
        return None
    hosts = sorted({h for c in bad for h in _probe_hosts(c)})
    return f"{_names(bad)} use probe or lifecycle hosts {_quoted(hosts)}"


def _apparmor(meta: Obj, spec: Obj) -> str | None:
    def bad_type(obj: Obj) -> bool:
        profile = _context(obj).get("appArmorProfile")
        return profile is not None and profile.get("type") not in APPARMOR_TYPES

    bad = ["pod"] if bad_type(spec) else []
    bad += [f'container "{c["name"]}"' for c in _containers(spec) if bad_type(c)]
    bad += [
        f"{key}={value!r}"
        for key, value in (meta.get("annotations") or {}).items()
        if key.startswith(APPARMOR_ANNOTATION)
        and value
        and value != "runtime/default"
        and not value.startswith("localhost/")
    ]
    return ", ".join(bad) or None


def _selinux(meta: Obj, spec: Obj) -> str | None:
    def bad(obj: Obj) -> bool:
        options = _context(obj).get("seLinuxOptions")
        return options is not None and (
            options.get("type", "") not in SELINUX_TYPES
            or bool(options.get("user"))
            or bool(options.get("role"))
        )

    containers = [c for c in _containers(spec) if bad(c)]
    setters = (["pod"] if bad(spec) else []) + ([_names(containers)] if containers else [])
    if not setters:
        return None
    return " and ".join(setters) + " set forbidden securityContext.seLinuxOptions"


def _proc_mount(meta: Obj, spec: Obj) -> str | None:
    bad = [c for c in _containers(spec) if _context(c).get("procMount", "Default") != "Default"]
    return f"{_names(bad)} must not set securityContext.procMount" if bad else None


def _proc_mount_baseline(meta: Obj, spec: Obj) -> str | None:
    return None if _user_namespaced(spec) else _proc_mount(meta, spec)


def _seccomp_types(spec: Obj) -> list[str]:
    """Setters of a seccomp profile type other than RuntimeDefault or Localhost."""
    bad = ["pod"] if _bad_seccomp(spec) else []
    return bad + [f'container "{c["name"]}"' for c in _containers(spec) if _bad_seccomp(c)]


def _bad_seccomp(obj: Obj) -> bool:
    profile = _context(obj).get("seccompProfile")
    return profile is not None and profile.get("type") not in SECCOMP_TYPES


def _seccomp_baseline(meta: Obj, spec: Obj) -> str | None:
    bad = _seccomp_types(spec)
    annotations = meta.get("annotations") or {}
    bad += [
        f"{key}={value!r}"
        for key, value in annotations.items()
        if (key == SECCOMP_POD_ANNOTATION or key.startswith(SECCOMP_CONTAINER_ANNOTATION))
        and value not in ("runtime/default", "docker/default")
        and not value.startswith("localhost/")
    ]
    return " and ".join(bad) + " must not set an unconfined seccomp profile" if bad else None


def _sysctls(meta: Obj, spec: Obj) -> str | None:
    found = [s.get("name") for s in _context(spec).get("sysctls") or []]
    bad = [n for n in found if n not in SAFE_SYSCTLS]
    return ", ".join(map(str, bad)) or None


def _restricted_volumes(meta: Obj, spec: Obj) -> str | None:
    bad = [v["name"] for v in spec.get("volumes") or [] if not set(v) & RESTRICTED_VOLUME_KINDS]
    if not bad:
        return None
    return f"{'volume' if len(bad) == 1 else 'volumes'} {_quoted(bad)} use restricted volume types"


def _privilege_escalation(meta: Obj, spec: Obj) -> str | None:
    if (spec.get("os") or {}).get("name") == "windows":
        return None
    bad = [c for c in _containers(spec) if _context(c).get("allowPrivilegeEscalation") is not False]
    return f"{_names(bad)} must set securityContext.allowPrivilegeEscalation=false" if bad else None


def _run_as_non_root(meta: Obj, spec: Obj) -> str | None:
    if _user_namespaced(spec):
        return None
    pod_bad, explicit, implicit = _explicit_or_implicit(spec, "runAsNonRoot", bool)
    setters = (["pod"] if pod_bad else []) + ([_names(explicit)] if explicit else [])
    if setters:
        return " and ".join(setters) + " must not set securityContext.runAsNonRoot=false"
    if implicit:
        return f"pod or {_names(implicit)} must set securityContext.runAsNonRoot=true"
    return None


def _run_as_user(meta: Obj, spec: Obj) -> str | None:
    if _user_namespaced(spec):
        return None
    bad = [c for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    setters = (["pod"] if _context(spec).get("runAsUser") == 0 else []) + (
        [_names(bad)] if bad else []
    )
    return " and ".join(setters) + " must not set runAsUser=0" if setters else None


def _seccomp_restricted(meta: Obj, spec: Obj) -> str | None:
    if (spec.get("os") or {}).get("name") == "windows":
        return None
    bad = _seccomp_types(spec)
    if bad:
        return " and ".join(bad) + " must set seccompProfile.type to RuntimeDefault or Localhost"
    implicit = _explicit_or_implicit(spec, "seccompProfile", lambda _: True)[2]
    if implicit:
        return (
            f"pod or {_names(implicit)} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost"'
        )
    return None


def _capabilities_restricted(meta: Obj, spec: Obj) -> str | None:
    if (spec.get("os") or {}).get("name") == "windows":
        return None
    details = []
    undropped = [
        c
        for c in _containers(spec)
        if "ALL" not in ((_context(c).get("capabilities") or {}).get("drop") or [])
    ]
    if undropped:
        details.append(f'{_names(undropped)} must set securityContext.capabilities.drop=["ALL"]')
    adding = [c for c in _containers(spec) if set(_added(c)) - RESTRICTED_CAPABILITIES]
    if adding:
        extra = sorted({a for c in adding for a in _added(c)} - RESTRICTED_CAPABILITIES)
        details.append(
            f"{_names(adding)} must not include {_quoted(extra)} in "
            "securityContext.capabilities.add"
        )
    return "; ".join(details) or None


@dataclass(frozen=True)
class Check:
    id: str
    level: Level
    reason: str  # as the API server words it
    find: Callable[[Obj, Obj], str | None]  # (pod metadata, pod spec) -> what is wrong
    replaces: str | None = None  # a looser check this one stands for at its level


CHECKS: tuple[Check, ...] = (
    Check("windowsHostProcess", "baseline", "hostProcess", _host_process),
    Check("hostNamespaces", "baseline", "host namespaces", _host_namespaces),
    Check("privileged", "baseline", "privileged", _privileged),
    Check("capabilities_baseline", "baseline", "non-default capabilities", _capabilities_baseline),
    Check("hostPathVolumes", "baseline", "hostPath volumes", _host_path_volumes),
    Check("hostPorts", "baseline", "hostPort", _host_ports),
    Check("hostProbesAndHostLifecycle", "baseline", "probe or lifecycle host",
          _probe_and_lifecycle_hosts),
    Check("appArmorProfile", "baseline", "forbidden AppArmor profile", _apparmor),
    Check("seLinuxOptions", "baseline", "seLinuxOptions", _selinux),
    Check("procMount", "baseline", "procMount", _proc_mount_baseline),
    Check("seccompProfile_baseline", "baseline", "seccompProfile", _seccomp_baseline),
    Check("sysctls", "baseline", "forbidden sysctls", _sysctls),
    Check("restrictedVolumes", "restricted", "restricted volume types", _restricted_volumes,
          replaces="hostPathVolumes"),
    Check("allowPrivilegeEscalation", "restricted", "allowPrivilegeEscalation != false",
          _privilege_escalation),
    Check("runAsNonRoot", "restricted", "runAsNonRoot != true", _run_as_non_root),
    Check("runAsUser", "restricted", "runAsUser=0", _run_as_user),
    Check("seccompProfile_restricted", "restricted", "seccompProfile", _seccomp_restricted,
          replaces="seccompProfile_baseline"),
    Check("capabilities_restricted", "restricted", "unrestricted capabilities",
          _capabilities_restricted, replaces="capabilities_baseline"),
    Check("procMount_restricted", "restricted", "procMount", _proc_mount, replaces="procMount"),
)  # fmt: skip


@dataclass(frozen=True)
class Violation:
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})"


def checks_of(level: Level) -> list[Check]:
    """The checks a pod must pass to meet `level`."""
    rank = LEVELS.index(level)
    chosen = [c for c in CHECKS if LEVELS.index(c.level) <= rank]
    replaced = {c.replaces for c in chosen}
    return [c for c in chosen if c.id not in replaced]


def violations(metadata: Obj, spec: Obj, level: Level) -> list[Violation]:
    """What keeps a pod (its metadata and spec) from meeting `level`; empty when it does."""
    found = ((c.reason, c.find(metadata, spec)) for c in checks_of(level))
    return [Violation(reason, detail) for reason, detail in found if detail is not None]


def level_met(metadata: Obj, spec: Obj) -> Level:
    """The strictest level a pod meets."""
    return next(lv for lv in reversed(LEVELS) if not violations(metadata, spec, lv))


@dataclass(frozen=True)
class RenderedPod:
    """A pod kube-ddp creates, or one the MPI Operator creates from kube-ddp's template."""

    name: str
    metadata: Obj
    spec: Obj


def rendered_pods(objects: list[Obj]) -> list[RenderedPod]:
    """The pods among rendered objects: worker pods, and the launcher's and workers' pod
    templates of an MPIJob (named by role: the MPI Operator names the pods)."""
    pods = []
    for obj in objects:
        if obj.get("kind") == "Pod":
            pods.append(RenderedPod(obj["metadata"]["name"], obj["metadata"], obj["spec"]))
        elif obj.get("kind") == names.MPIJOB_KIND:
            for role, replica in obj["spec"]["mpiReplicaSpecs"].items():
                template = replica["template"]
                name = f"{obj['metadata']['name']}-{role.lower()}"
                pods.append(RenderedPod(name, template.get("metadata") or {}, template["spec"]))
    return pods
