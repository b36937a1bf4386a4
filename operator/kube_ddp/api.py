"""The DDPTrainingJob API: pydantic models of the spec and status, the single source of truth.

The CRD schema is generated from these models (kube_ddp.crd), and the same models validate a
job file for `kube-ddp render`. Cross-field rules are `Rule`s: each carries its CEL expression
for the API server and the same check in Python, side by side, so a job the server rejects is
also rejected locally with the same words (tests/api_cases.py holds a case for every rule, and
both tiers check it).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from ddp_trainer import contract
from ddp_trainer.options import TrainerOptions
from kube_ddp import names, own_command
from kube_ddp.server_input import as_the_server_reads


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: `cel` for the API server, `holds` for Python, one message for both.

    `message` may name attributes as `{self.field}`; the server then needs the same text as
    a CEL `message_expression`. A rule `on` a field applies to that field's value (a map, say)
    rather than to the whole model.
    """

    cel: str
    message: str
    holds: Callable[[Any], bool]
    message_expression: str | None = None
    on: str | None = None

    def to_cel(self) -> dict[str, str]:
        if self.message_expression:
            return {"rule": self.cel, "messageExpression": self.message_expression}
        return {"rule": self.cel, "message": self.message}


class Model(BaseModel):
    """camelCase in YAML, unknown keys refused, and `RULES` checked after field validation."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()
    # Keys users know from Kubernetes that this model does not take, and why: refused by
    # the API server and by the models alike, with that reason (kube_ddp.jobfile).
    UNSUPPORTED: ClassVar[dict[str, str]] = {}

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Attach RULES as CEL `x-kubernetes-validations` (see kube_ddp.crd), and each
        UNSUPPORTED key as a property that a rule refuses with its reason."""
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        for key, reason in cls.UNSUPPORTED.items():
            # Typed as in Kubernetes, so that CEL knows the field and the rule says why.
            target["properties"][key] = {
                **kubernetes_type(key),
                "description": f"Not supported: {reason}.",
            }
            target.setdefault("x-kubernetes-validations", []).append(
                {"rule": f"!has(self.{key})", "message": unsupported_message(key, reason)}
            )
        for rule in cls.RULES:
            node = target
            if rule.on:
                node = target["properties"][cls.model_fields[rule.on].alias or rule.on]
            node.setdefault("x-kubernetes-validations", []).append(rule.to_cel())
        return schema

    @model_validator(mode="after")
    def _check_rules(self) -> Any:
        for rule in self.RULES:
            if not rule.holds(getattr(self, rule.on) if rule.on else self):
                raise ValueError(rule.message.format(self=self))
        return self


def unsupported_message(key: str, reason: str) -> str:
    return f"{key} is not supported: {reason}"


AcceleratorType = Literal["nvidia", "gaudi", "amd", "cpu"]
ACCELERATOR_RESOURCES: dict[str, str] = {
    "nvidia": "nvidia.com/gpu",
    "gaudi": "habana.ai/gaudi",
    "amd": "amd.com/gpu",
}
ACCELERATOR_BACKENDS: dict[str, str] = {
    "nvidia": "nccl",
    "gaudi": "hccl",
    "amd": "nccl",
    "cpu": "gloo",
}
MAX_NODES = 1024
TRAINER_SSH_DIR = "/home/trainer/.ssh"  # the trainer image's user's (contract.IMAGE_UID)
ROOT_SSH_DIR = "/root/.ssh"
MAX_SECONDS = contract.MAX_SECONDS
# The longest checkpoint save a report may give (a day): the grace period is fitted to it.
MAX_SAVE_SECONDS = 24 * 3600
MAX_PORT = 65535
MIN_PORT = 1024  # spec.port's least: the ports below are the system's
# Bounds of what has no bound of its own: each far past any real job, so that every value the
# CRD takes is one the operator can count, add to a time, and write back.
MAX_COUNT = 2**31 - 1  # a count or an index, as Kubernetes' int32 counts
MAX_ARG = 131072  # one argument or environment string (Linux's MAX_ARG_STRLEN)
MAX_ARGS = 4096  # arguments of one command
MAX_IMAGE = 1024  # an image reference: name (255), tag (128) and digest
MAX_REASON = 1024  # a CamelCase reason, as a Kubernetes condition's
MAX_LABEL_VALUE = 63
MAX_ANNOTATION_VALUE = 256 * 1024  # Kubernetes' limit on all of an object's annotations
MAX_MAP = 64  # entries of a map of labels, selectors or resources
MAX_EXTRA_ITEMS = 256  # entries of a list the template adds to (volumes, mounts, ...)
MAX_EXIT_CODE = 2**31 - 1  # the kubelet's int32
MIN_EXIT_CODE = -(2**31)
# `<name>-worker-<index>` must stay a 63-character DNS label (hostname) for up to 1024 nodes.
MAX_NAME_LENGTH = 63 - len("-worker-") - len(str(MAX_NODES - 1))
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
Quantity = (
    Annotated[int, Field(le=contract.MAX_INT)]
    | Annotated[str, Field(max_length=64, pattern=QUANTITY_PATTERN)]
)
# A Kubernetes object name (a DNS subdomain), as the API server checks a Secret's, a
# PriorityClass's or a ServiceAccount's name: one path segment, no dot-segment, no slash.
_OBJECT_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=_OBJECT_NAME)]
Path = Annotated[str, Field(min_length=1, max_length=contract.MAX_PATH)]
Arg = Annotated[str, Field(max_length=MAX_ARG)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]
FreeForm = dict[str, Any]
Obj = dict[str, Any]  # a Kubernetes object as JSON: one the API server sent, or one built for it


def _cel_list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


class Accelerator(Model):
    """Which accelerator each worker node runs on, and how many per node."""

    RULES = (
        Rule(
            cel="self.type == 'cpu' || has(self.perNode)",
            message="perNode is required for accelerator type {self.type}: "
            "set accelerator.perNode to the devices each worker pod gets",
            message_expression="'perNode is required for accelerator type ' + self.type + "
            "': set accelerator.perNode to the devices each worker pod gets'",
            holds=lambda a: a.type == "cpu" or a.per_node is not None,
        ),
    )

    type: AcceleratorType = Field(
        "cpu",
        description="nvidia (nvidia.com/gpu, nccl), gaudi (habana.ai/gaudi, hccl), "
        "amd (amd.com/gpu, nccl/RCCL) or cpu (gloo).",
    )
    per_node: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Accelerators per worker pod; required unless type is cpu.",
    )

    @property
    def resource(self) -> str | None:
        return ACCELERATOR_RESOURCES.get(self.type)


class ElasticPolicy(Model):
    """torchrun elastic training: the group may run with any node count in [minNodes, maxNodes]."""

    RULES = (
        Rule(
            cel="self.minNodes <= self.maxNodes",
            message="minNodes must not exceed maxNodes",
            holds=lambda e: e.min_nodes <= e.max_nodes,
        ),
    )

    min_nodes: int = Field(ge=1, le=MAX_NODES, description="Fewest nodes the job runs with.")
    max_nodes: int = Field(ge=1, le=MAX_NODES, description="Most nodes the job runs with.")
    max_restarts: int = Field(
        3,
        ge=0,
        le=MAX_COUNT,
        description="Restarts torchrun itself makes (--max-restarts) before failing.",
    )


class MPIOptions(Model):
    """How the MPI launcher maps processes (launcher: mpi)."""

    sockets_per_node: int | None = Field(
        None,
        ge=1,
        le=64,
        description="CPU sockets per node: ranks are spread evenly over them, each bound to "
        "coresPerProcess cores (--map-by ppr:<ranks per socket>:socket:PE=<cores> --bind-to "
        "core). Gaudi's default: 2. Other accelerators bind nothing unless this or "
        "coresPerProcess is set (--map-by slot --bind-to none, as Horovod's mpirun line).",
    )
    cores_per_process: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Physical cores bound to each process (PE=<n>): cores per socket divided "
        "by accelerators per socket. Gaudi's default: 6; else 1 where socketsPerNode is set.",
    )
    map_by: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_REASON,
        description="The whole --map-by value (processes bound to cores), replacing the one "
        "socketsPerNode and coresPerProcess make.",
    )
    extra_args: list[Arg] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="More mpirun arguments, placed before the program. $NAME and ${NAME} are "
        "the launcher's environment variables (the image's too: --prefix $MPI_ROOT), expanded "
        "by its shell and nothing else; $$ is a literal $. Without a --prefix here, mpirun gets "
        "--prefix $MPI_ROOT where the image sets MPI_ROOT.",
    )
    ssh_port: int = Field(
        2222,
        ge=1,
        le=65535,
        description="Port of the workers' sshd, which mpirun reaches over ssh; below 1024 only "
        "when the image runs as root.",
    )
    ssh_auth_mount_path: str | None = Field(
        None,
        max_length=contract.MAX_PATH,
        pattern=r"^/\S*$",
        description="Where the MPI Operator mounts the job's ssh keys: the .ssh directory of "
        "the user the image runs as. Unset: /root/.ssh where the template runs as root "
        "(runAsUser: 0), else /home/trainer/.ssh (the trainer image's user).",
    )


class RunPolicy(Model):
    """How failures, time limits and clean-up are handled (Kubeflow's runPolicy vocabulary)."""

    backoff_limit: int = Field(
        3,
        ge=0,
        le=MAX_PORT - MIN_PORT,
        description="Group restarts allowed before the job is marked Failed.",
    )
    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = Field(
        contract.DEFAULT_RESTART_POLICY,
        description="Which worker failures restart the group: ExitCode (eviction, deletion, "
        "node loss, exit codes >= 128 or listed in retryableExitCodes), OnFailure (any failure) "
        "or Never (the first failure fails the job).",
    )
    retryable_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list,
        max_length=255,
        description="Exit codes below 128 that still count as retryable under ExitCode.",
    )
    restart_strategy: Literal["InPlace", "Recreate"] = Field(
        "InPlace",
        description="How a retryable failure restarts the group: InPlace (a rank that fails in "
        "a healthy pod is restarted there by the pod's agent, with its peers, and a lost pod is "
        "the only one recreated) or Recreate (every pod is deleted and created again). InPlace "
        "needs the trainer package in the image (the trainer image, or a job that runs the "
        "trainer); other jobs are recreated.",
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_SECONDS,
        description="Fail the job (DeadlineExceeded) this long after it started.",
    )
    progress_deadline_seconds: int | None = Field(
        None,
        ge=names.MIN_PROGRESS_DEADLINE_SECONDS,
        le=MAX_SECONDS,
        description="Restart the group (ProgressDeadlineExceeded) when rank 0 has not reported "
        "progress for this long while every worker runs; never before the attempt's first "
        f"report. At least {names.MIN_PROGRESS_DEADLINE_SECONDS} (twice the trainer's "
        "heartbeat). Unset: learned once an epoch ended, "
        f"{names.LEARNED_DEADLINE_FACTOR} times the longest time between two of rank 0's "
        "reports (status.training.longestReportGapSeconds), at least "
        f"{names.MIN_LEARNED_DEADLINE_SECONDS}.",
    )
    unreachable_toleration_seconds: int = Field(
        names.DEFAULT_UNREACHABLE_TOLERATION_SECONDS,
        ge=0,
        le=MAX_SECONDS,
        description="How long a worker stays on a node that stopped reporting (tainted "
        "node.kubernetes.io/unreachable or not-ready) before it is evicted and the group "
        "restarts elsewhere: the tolerationSeconds of the NoExecute tolerations kube-ddp adds "
        "for both taints (Kubernetes' --default-unreachable-toleration-seconds, 300, for this "
        "job). A toleration of the template for either taint is kept instead.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        le=MAX_SECONDS,
        description="Delete the job this long after it Succeeded or Failed.",
    )
    clean_pod_policy: Literal["Running", "All", "None"] = Field(
        "Running",
        description="Pods removed when the job finishes: Running (those still running), "
        "All, or None.",
    )
    suspend: bool = Field(
        False,
        description="Suspended: the pods are removed and the job is kept; false again "
        "recreates them without counting a restart (the Kueue contract).",
    )


class EnvVar(Model):
    """An environment variable for every worker container (Kubernetes EnvVar)."""

    RULES = (
        Rule(
            cel=f"!(self.name in {_cel_list(names.RESERVED_ENV)})",
            message="{self.name} is reserved: kube-ddp sets it on every worker "
            "(the env contract); remove it from spec.env",
            message_expression="self.name + ' is reserved: kube-ddp sets it on every worker "
            "(the env contract); remove it from spec.env'",
            holds=lambda e: e.name not in names.RESERVED_ENV,
        ),
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set value or valueFrom, not both",
            holds=lambda e: not (e.value is not None and e.value_from is not None),
        ),
    )

    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[^=]+$", description="Variable name."
    )
    value: str | None = Field(None, max_length=MAX_ARG, description="Literal value.")
    value_from: FreeForm | None = Field(
        None, description="Source of the value (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )


def _no_accelerator_keys(resources: dict[str, Any]) -> bool:
    return not set(resources) & set(ACCELERATOR_RESOURCES.values())


_CEL_ACCELERATOR_KEYS = _cel_list(list(ACCELERATOR_RESOURCES.values()))


class Resources(Model):
    """Container resources, merged with the accelerator's (which the operator owns)."""

    RULES = tuple(
        Rule(
            cel=f"self.all(k, !(k in {_CEL_ACCELERATOR_KEYS}))",
            message=f"accelerator devices in resources.{key} are set by the operator: "
            "use accelerator.type and accelerator.perNode instead",
            holds=_no_accelerator_keys,
            on=key,
        )
        for key in ("limits", "requests")
    )

    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_MAP, description="Limits, e.g. cpu: 8, memory: 64Gi."
    )
    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=MAX_MAP, description="Requests, e.g. cpu: 8, memory: 64Gi."
    )


# The schema type of each Kubernetes field below, by its kind in a PodSpec or Container.
_KINDS = {
    "objects": ("containers", "ephemeralContainers", "env", "ports", "volumeMounts"),
    "strings": ("command", "args"),
    "string": ("restartPolicy", "hostname", "subdomain", "nodeName", "serviceAccount", "name",
               "image", "imagePullPolicy"),
    "boolean": ("enableServiceLinks", "hostNetwork", "hostPID", "hostIPC"),
    "integer": ("activeDeadlineSeconds",),
    "object": ("metadata", "spec", "resources"),
}  # fmt: skip


def kubernetes_type(key: str) -> dict[str, Any]:
    """The structural schema of the Kubernetes field `key` (one of _KINDS')."""
    kind = next(kind for kind, keys in _KINDS.items() if key in keys)
    free_object: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    shapes: dict[str, dict[str, Any]] = {
        "objects": {"type": "array", "items": free_object},
        "strings": {"type": "array", "items": {"type": "string"}},
        "object": free_object,
    }
    return shapes.get(kind, {"type": kind})


# Fields of a Kubernetes PodSpec or Container that a job's template cannot set, and why.
UNSUPPORTED_POD_FIELDS: dict[str, str] = {
    "containers": "the worker container is kube-ddp's: set its settings in template.container; "
    "a sidecar is an initContainer with restartPolicy: Always (Kubernetes' native sidecars)",
    "restartPolicy": "restarts are kube-ddp's, for the whole group: use runPolicy.restartPolicy",
    "activeDeadlineSeconds": "use runPolicy.activeDeadlineSeconds",
    "hostname": "kube-ddp names each worker for the rendezvous",
    "subdomain": "kube-ddp names each worker for the rendezvous",
    "enableServiceLinks": "kube-ddp turns it off: the env contract's names must not clash",
    "nodeName": "use nodeSelector or affinity",
    "hostNetwork": "the workers reach each other through the pod network (the job's "
    "headless Service); for RDMA, add the network's devices as resources",
    "hostPID": "a worker sees its own processes only",
    "hostIPC": "kube-ddp sets it for accelerator type gaudi only",
    "ephemeralContainers": "add them to a running pod with kubectl debug",
    "serviceAccount": "use serviceAccountName",
    "metadata": "template's fields are flat: write template.labels and template.annotations",
    "spec": "template's fields are flat: write template.volumes, template.nodeSelector, ...",
}
UNSUPPORTED_CONTAINER_FIELDS: dict[str, str] = {
    "name": "the worker container is named by kube-ddp",
    "image": "use spec.image",
    "imagePullPolicy": "use spec.imagePullPolicy",
    "command": "use spec.command",
    "args": "use spec.args",
    "env": "use spec.env",
    "resources": "use spec.resources (and accelerator)",
    "ports": "kube-ddp opens spec.port",
    "volumeMounts": "use template.volumeMounts",
}


class ContainerSettings(Model):
    """Settings of the worker container, as in a Kubernetes Container (the fields kube-ddp
    does not set itself: image, command, args, env and resources are spec's own)."""

    UNSUPPORTED = UNSUPPORTED_CONTAINER_FIELDS

    env_from: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ITEMS,
        description="Environment from ConfigMaps and Secrets (Kubernetes EnvFromSource); "
        "the env contract's names still win.",
    )
    security_context: FreeForm | None = Field(
        None,
        description="Container security context (Kubernetes SecurityContext), merged over "
        "kube-ddp's defaults allowPrivilegeEscalation: false and capabilities.drop: [ALL] "
        "(the restricted Pod Security Standard); on gaudi, SYS_NICE is added to its "
        "capabilities.",
    )
    working_dir: Path | None = Field(None, description="Working directory; the image's when unset.")
    lifecycle: FreeForm | None = Field(None, description="postStart and preStop hooks.")
    liveness_probe: FreeForm | None = Field(None, description="Liveness probe.")
    readiness_probe: FreeForm | None = Field(None, description="Readiness probe.")
    startup_probe: FreeForm | None = Field(None, description="Startup probe.")


class PodTemplateOverrides(Model):
    """Pod settings merged into every worker pod; the operator's own fields are kept."""

    UNSUPPORTED = UNSUPPORTED_POD_FIELDS

    RULES = (
        Rule(
            cel=f"self.all(k, !(k in {_cel_list(names.OWNED_LABELS)}))",
            message="labels "
            + ", ".join(names.OWNED_LABELS)
            + " are set by the operator; choose other label keys",
            holds=lambda labels: not set(labels) & set(names.OWNED_LABELS),
            on="labels",
        ),
    )

    labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_MAP, description="Extra labels for worker pods."
    )
    annotations: dict[str, Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]] = Field(
        default_factory=dict,
        max_length=MAX_EXTRA_ITEMS,
        description="Extra annotations for worker pods.",
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_MAP, description="Node selector for worker pods."
    )
    tolerations: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ITEMS,
        description="Tolerations, added to the accelerator's.",
    )
    affinity: FreeForm | None = Field(None, description="Pod affinity (Kubernetes Affinity).")
    volumes: list[FreeForm] = Field(
        default_factory=list, max_length=MAX_EXTRA_ITEMS, description="Extra pod volumes."
    )
    volume_mounts: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ITEMS,
        description="Extra mounts in the trainer container.",
    )
    priority_class_name: ObjectName | None = Field(
        None, description="PriorityClass of worker pods."
    )
    scheduler_name: ObjectName | None = Field(
        None,
        description="Scheduler for worker pods; unset: the default scheduler, or the one "
        "scheduling.gang names (volcano, scheduler-plugins-scheduler).",
    )
    service_account_name: ObjectName | None = Field(
        None,
        description="ServiceAccount for worker pods (default: the job's own, <job>-trainer). "
        "It reports no progress unless serviceAccountReports is true.",
    )
    service_account_reports: bool = Field(
        False,
        description="Bind serviceAccountName to the job's status Role, so that rank 0 and the "
        "pod agent report progress (status.training, status.rankRestart) as that account. "
        "Every pod running as it may then write those fields of this job. Off: the workers "
        "report nothing (no progress, no learned progress deadline, in-place rank restarts "
        "not counted in status.restarts).",
    )
    security_context: FreeForm | None = Field(
        None,
        description="Pod security context (Kubernetes PodSecurityContext), merged over "
        "kube-ddp's defaults runAsNonRoot: true (left out when runAsUser is 0) and "
        "seccompProfile RuntimeDefault (the restricted Pod Security Standard); fsGroup "
        f"defaults to {names.TRAINER_IMAGE_GID}, the trainer image's group.",
    )
    image_pull_secrets: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_MAP,
        description="Secrets to pull the image with (Kubernetes LocalObjectReference: name).",
    )
    init_containers: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_MAP,
        description="Init containers (Kubernetes Container), run before the worker; one with "
        "restartPolicy: Always is a sidecar that runs beside it.",
    )
    container: ContainerSettings = Field(
        default_factory=ContainerSettings,
        description="Settings of the worker container: envFrom, securityContext, workingDir, "
        "lifecycle and probes.",
    )
    topology_spread_constraints: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_MAP,
        description="Topology spread constraints of the worker pods.",
    )
    runtime_class_name: ObjectName | None = Field(None, description="RuntimeClass of worker pods.")
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=0,
        le=MAX_SECONDS,
        description="Seconds a deleted worker gets to stop before it is killed.",
    )
    dns_config: FreeForm | None = Field(None, description="DNS settings (Kubernetes PodDNSConfig).")
    host_aliases: list[FreeForm] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ITEMS,
        description="Extra /etc/hosts entries (Kubernetes HostAlias).",
    )


GangScheduler = Literal["kubernetes", "coscheduling", "volcano"]


class GangPolicy(Model):
    """All-or-nothing placement of the workers: a PodGroup the operator creates and owns."""

    RULES = (
        Rule(
            cel="!has(self.scheduleTimeoutSeconds) || "
            "(has(self.scheduler) && self.scheduler == 'coscheduling')",
            message="scheduleTimeoutSeconds is read only by scheduler coscheduling: name it",
            holds=lambda g: g.schedule_timeout_seconds is None or g.scheduler == "coscheduling",
        ),
        Rule(
            cel="!has(self.queue) || (has(self.scheduler) && self.scheduler == 'volcano')",
            message="queue is read only by scheduler volcano: name it (a Kueue queue is the "
            "label kueue.x-k8s.io/queue-name)",
            holds=lambda g: g.queue is None or g.scheduler == "volcano",
        ),
    )

    scheduler: GangScheduler | None = Field(
        None,
        description="Whose PodGroup: kubernetes (scheduling.k8s.io/v1alpha2, kube-scheduler's "
        "GangScheduling plugin; alpha, behind the GenericWorkload and GangScheduling feature "
        "gates), coscheduling (scheduler-plugins, scheduling.x-k8s.io/v1alpha1) or volcano "
        "(scheduling.volcano.sh/v1beta1). Unset: the first of kubernetes, volcano and "
        "coscheduling whose PodGroup this cluster serves (launcher mpi: volcano, then "
        "coscheduling), looked up as the pods are made; none served fails the job saying "
        "what to install.",
    )
    min_member: int | None = Field(
        None,
        ge=1,
        le=MAX_NODES,
        description="Workers that must be placed together before any starts; defaults to "
        "nodes (elastic: minNodes).",
    )
    schedule_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_SECONDS,
        description="coscheduling: how long a partly placed gang may wait.",
    )
    queue: ObjectName | None = Field(None, description="volcano: the Volcano queue.")


# A node label key (Kubernetes' qualified name), at most 63 characters as Kueue's topology
# levels are (PodSetTopologyRequest.required/preferred).
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class TopologyPolicy(Model):
    """All workers in one topology domain (Kueue's Topology Aware Scheduling): the nodes
    sharing a value of the node label `level`, as Kueue's podset-required-topology and
    podset-preferred-topology annotations say it."""

    level: str = Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_KEY_PATTERN,
        description="The node label of the topology level whose domain the workers share "
        "(a rack or block label, or kubernetes.io/hostname): one of the levels of the "
        "Topology that the queue's TAS ResourceFlavor names.",
    )
    mode: Literal["Required", "Preferred"] = Field(
        "Required",
        description="Required: wait until one domain of that level has room for every "
        "worker; Preferred: one domain of that level if one has room, else one domain of "
        "the next level up, and so on, else spread over several.",
    )


class SchedulingPolicy(Model):
    """How the workers are scheduled together (Kubeflow's runPolicy.schedulingPolicy, moved
    next to the pod template it applies to)."""

    gang: GangPolicy | None = Field(
        None, description="All-or-nothing placement; unset: workers are placed one by one."
    )
    topology: TopologyPolicy | None = Field(
        None,
        description="Place the workers in one topology domain through Kueue's Topology Aware "
        "Scheduling (with launcher mpi, the launcher on any node of the queue's flavor); "
        "needs the label kueue.x-k8s.io/queue-name.",
    )


class NetworkPolicySettings(Model):
    """Who may connect to the job's pods. The rendezvous (torch's TCPStore on worker 0) and,
    with launcher mpi, sshd on every worker take no password: the job's NetworkPolicy admits
    only the job's own pods to any of its pods' ports."""

    RULES = (
        Rule(
            cel="!has(self.enabled) || self.enabled || !has(self.ingress) || "
            "size(self.ingress) == 0",
            message="ingress widens the job's NetworkPolicy, which enabled: false turns off: "
            "remove one of them",
            holds=lambda n: n.enabled is not False or not n.ingress,
        ),
    )

    enabled: bool | None = Field(
        None,
        description="Create the job's NetworkPolicy (ingress to its pods from its own pods "
        "only; egress untouched). Unset: the operator's default (--network-policy, the chart's "
        "operator.networkPolicy).",
    )
    ingress: list[FreeForm] = Field(
        default_factory=list,
        max_length=32,
        description="More ingress rules for the job's pods, each a Kubernetes "
        "NetworkPolicyIngressRule (from: podSelector, namespaceSelector, ipBlock; ports), "
        "admitted beside the job's own pods: a metrics scraper, a debugging pod.",
    )


def _nproc_fits(spec: DDPTrainingJobSpec) -> bool:
    per_node = spec.accelerator.per_node
    return (
        spec.accelerator.type == "cpu"
        or spec.nproc_per_node is None
        or per_node is None
        or spec.nproc_per_node <= per_node
    )


# A backend named in ACCELERATOR_BACKENDS runs only on the accelerators it is named for, except
# gloo: CPU collectives run beside any accelerator.
ANY_ACCELERATOR_BACKEND = "gloo"
_ACCELERATORS_OF = {
    backend: [a for a, b in ACCELERATOR_BACKENDS.items() if b == backend]
    for backend in sorted(set(ACCELERATOR_BACKENDS.values()) - {ANY_ACCELERATOR_BACKEND})
}


def _backend_fits(spec: DDPTrainingJobSpec) -> bool:
    accelerators = _ACCELERATORS_OF.get(spec.backend)
    return accelerators is None or spec.accelerator.type in accelerators


_CEL_BACKEND_FITS = (
    "!("
    + " || ".join(
        f"(self.backend == '{backend}' && !(self.accelerator.type in {_cel_list(accelerators)}))"
        for backend, accelerators in _ACCELERATORS_OF.items()
    )
    + ")"
)


class CheckpointStore(Model):
    """The credentials of the S3-compatible object store that `trainer.checkpointDir:
    s3://BUCKET/PREFIX` names."""

    secret_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=_OBJECT_NAME,
        description="A Secret in the job's namespace whose keys "
        f"{', '.join(contract.S3_SECRET_KEYS)} (and, where it has them, "
        f"{', '.join(contract.S3_OPTIONAL_SECRET_KEYS)}) become the variables of the same "
        "names on every worker; a name that env sets is left to env.",
    )


def _s3_checkpoint_dir(spec: DDPTrainingJobSpec) -> str | None:
    directory = spec.trainer.checkpoint_dir if spec.trainer is not None else None
    return directory if directory and directory.startswith(contract.S3_SCHEME) else None


_CEL_S3_CHECKPOINT_DIR = (
    f"has(self.trainer) && has(self.trainer.checkpointDir) && "
    f"self.trainer.checkpointDir.startsWith('{contract.S3_SCHEME}')"
)


class DDPTrainingJobSpec(Model):
    """A PyTorch DDP training job: N worker pods, each running nprocPerNode processes."""

    nodes: int = Field(ge=1, le=MAX_NODES, description="Worker pods, one per node.")
    accelerator: Accelerator = Field(
        default_factory=Accelerator,
        description="The accelerator of each worker node.",
        json_schema_extra={"default": {"type": "cpu"}},  # the CEL rules read accelerator.type
    )
    nproc_per_node: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Processes per worker pod; defaults to accelerator.perNode, 1 for cpu.",
    )
    launcher: Literal["torchrun", "mpi"] = Field(
        "torchrun",
        description="torchrun: one pod per node, torchrun in each; mpi: a Kubeflow MPIJob "
        "whose launcher runs mpirun (the Gaudi/Horovod way).",
    )
    backend: Literal["auto", "nccl", "hccl", "gloo"] = Field(
        "auto",
        description="torch.distributed backend; auto picks nccl (nvidia, amd), hccl (gaudi) "
        "or gloo (cpu).",
    )
    port: int = Field(
        contract.DEFAULT_PORT,
        ge=MIN_PORT,
        le=MAX_PORT,
        description="Rendezvous port on worker 0 for the first attempt; a group restart's "
        "attempt n uses port + n, so a rank of an earlier attempt can never join a later group.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_IMAGE,
        description="Worker image; the operator's default trainer image when unset.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Image pull policy of the worker containers."
    )
    trainer: TrainerOptions | None = Field(
        None,
        description="Options of the built-in trainer (python -m ddp_trainer); each key is "
        "its --kebab-case flag.",
    )
    checkpoint_store: CheckpointStore | None = Field(
        None,
        description="Checkpoints in an S3-compatible object store (trainer.checkpointDir: "
        "s3://BUCKET/PREFIX): the Secret with its credentials and, optionally, its endpoint "
        "and region.",
    )
    command: list[Arg] | None = Field(
        None,
        min_length=1,
        max_length=MAX_ARGS,
        description="Your own program instead of the trainer; the env contract still applies.",
    )
    args: list[Arg] | None = Field(None, max_length=MAX_ARGS, description="Arguments to command.")
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra environment for the workers; the env contract's names are reserved.",
        max_length=128,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="Container resources, merged with the accelerator's.",
    )
    template: PodTemplateOverrides = Field(
        default_factory=PodTemplateOverrides,
        description="Worker pod settings, named as in a Kubernetes PodSpec: labels, "
        "annotations, volumes, volumeMounts, nodeSelector, tolerations, affinity, "
        "priorityClassName, schedulerName, serviceAccountName, securityContext, "
        "imagePullSecrets, initContainers, topologySpreadConstraints, runtimeClassName, "
        "terminationGracePeriodSeconds, dnsConfig, hostAliases; container: the worker "
        "container's envFrom, securityContext, workingDir, lifecycle and probes.",
    )
    elastic: ElasticPolicy | None = Field(
        None, description="Elastic training with torchrun (node count within a range)."
    )
    mpi: MPIOptions | None = Field(None, description="Process mapping of the mpi launcher.")
    scheduling: SchedulingPolicy | None = Field(
        None,
        description="Gang (all-or-nothing) scheduling and topology-aware placement of the workers.",
    )
    network_policy: NetworkPolicySettings | None = Field(
        None,
        description="Who may connect to the job's pods: its NetworkPolicy, on or off, and "
        "what it admits beside the job's own pods.",
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy,
        description="Restarts, deadlines and clean-up.",
        json_schema_extra={"default": {}},
    )

    # Cross-field rules: each CEL for the API server beside its Python check, one message.
    RULES = (
        Rule(
            cel="!has(self.elastic) || "
            "(self.elastic.minNodes <= self.nodes && self.nodes <= self.elastic.maxNodes)",
            message="nodes must lie within elastic.minNodes..elastic.maxNodes",
            holds=lambda s: (
                s.elastic is None or s.elastic.min_nodes <= s.nodes <= s.elastic.max_nodes
            ),
        ),
        Rule(
            cel="!has(self.elastic) || self.launcher != 'mpi'",
            message="elastic is not supported with launcher mpi: use launcher torchrun "
            "or remove elastic",
            holds=lambda s: s.elastic is None or s.launcher != "mpi",
        ),
        Rule(
            cel="!has(self.mpi) || self.launcher == 'mpi'",
            message="mpi settings are only read with launcher mpi: set launcher: mpi or remove mpi",
            holds=lambda s: s.mpi is None or s.launcher == "mpi",
        ),
        Rule(
            cel="!has(self.scheduling) || !has(self.scheduling.gang) || "
            "!has(self.scheduling.gang.minMember) || self.scheduling.gang.minMember <= self.nodes",
            message="scheduling.gang.minMember must not exceed nodes",
            holds=lambda s: s.gang_min_member is None or s.gang_min_member <= s.nodes,
        ),
        Rule(
            # The MPI Operator v0.8.2 reads its MPIJobs with Kubernetes 1.35's PodSpec, which has
            # no schedulingGroup: the pods it creates could never join Kubernetes' PodGroup.
            cel="!has(self.scheduling) || !has(self.scheduling.gang) || self.launcher != 'mpi' "
            "|| !has(self.scheduling.gang.scheduler) "
            "|| self.scheduling.gang.scheduler != 'kubernetes'",
            message="scheduling.gang with launcher mpi needs scheduler coscheduling or volcano: "
            "the MPI Operator drops spec.schedulingGroup, by which a pod joins a kubernetes "
            "PodGroup, from the pods it creates",
            holds=lambda s: (
                s.scheduling is None
                or s.scheduling.gang is None
                or s.launcher != "mpi"
                or s.scheduling.gang.scheduler != "kubernetes"
            ),
        ),
        Rule(
            cel=f"self.port + self.runPolicy.backoffLimit <= {MAX_PORT}",
            message=f"port + runPolicy.backoffLimit must be at most {MAX_PORT}: each group restart "
            "rendezvous on the next port; lower port or backoffLimit",
            holds=lambda s: s.rendezvous_port(s.run_policy.backoff_limit) <= MAX_PORT,
        ),
        Rule(
            cel="!has(self.args) || has(self.command)",
            message="args needs command: set command to your program, or use trainer "
            "for the built-in entrypoint",
            holds=lambda s: s.args is None or s.command is not None,
        ),
        Rule(
            cel="!(has(self.command) && has(self.trainer))",
            message="set either command (your own program) or trainer (the built-in "
            "entrypoint's options), not both",
            holds=lambda s: not (s.command is not None and s.trainer is not None),
        ),
        Rule(
            cel=f"!({_CEL_S3_CHECKPOINT_DIR}) || "
            f"self.trainer.checkpointDir.matches('{contract.S3_URI_PATTERN}')",
            message="trainer.checkpointDir must be s3://BUCKET or s3://BUCKET/PREFIX, the "
            "bucket 3-63 lowercase letters, digits, dots and hyphens",
            holds=lambda s: (
                (uri := _s3_checkpoint_dir(s)) is None
                or re.fullmatch(contract.S3_URI_PATTERN, uri) is not None
            ),
        ),
        Rule(
            cel=f"!has(self.checkpointStore) || has(self.command) || ({_CEL_S3_CHECKPOINT_DIR})",
            message="checkpointStore holds the credentials of an object store: set "
            "trainer.checkpointDir to s3://BUCKET/PREFIX, or remove checkpointStore",
            holds=lambda s: (
                s.checkpoint_store is None
                or s.command is not None
                or _s3_checkpoint_dir(s) is not None
            ),
        ),
        Rule(
            cel="!has(self.checkpointStore) || self.launcher != 'mpi'",
            message="checkpointStore is not supported with launcher mpi yet: give the workers "
            "the AWS_* variables in env (valueFrom.secretKeyRef) instead",
            holds=lambda s: s.checkpoint_store is None or s.launcher != "mpi",
        ),
        Rule(
            cel="!has(self.nprocPerNode) || self.accelerator.type == 'cpu' || "
            "!has(self.accelerator.perNode) || self.nprocPerNode <= self.accelerator.perNode",
            message="nprocPerNode must not exceed accelerator.perNode: one process per accelerator",
            holds=_nproc_fits,
        ),
        Rule(
            cel=_CEL_BACKEND_FITS,
            message="backend {self.backend} does not run on accelerator "
            "{self.accelerator.type}: use backend auto",
            message_expression="'backend ' + self.backend + ' does not run on accelerator ' + "
            "self.accelerator.type + ': use backend auto'",
            holds=_backend_fits,
        ),
    )

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        seen = [e.name for e in env]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice:
            raise ValueError(f"duplicate env names: {', '.join(twice)}")
        return env

    def rendezvous_port(self, attempt: int) -> int:
        """Worker 0's rendezvous port in `attempt`: its own for each attempt, so a rank of an
        earlier attempt (its node back after it was taken for lost) finds nothing to join."""
        return self.port + attempt

    @property
    def holds_the_trainer(self) -> bool:
        """Whether the image has the trainer package (and so `ddp_trainer.torchrun`): the
        operator's trainer image, or any image that runs the trainer."""
        return self.command is None or self.image is None

    @property
    def restarts_in_place(self) -> bool:
        """Whether a retryable failure restarts the ranks in their pods and replaces only a lost
        pod (docs/design.md, "Failure rules"): restartStrategy InPlace, torchrun's launcher, an
        image with the agent that does it, and no command that starts a launcher of its own
        (kube-ddp's agent is not in front of it)."""
        return (
            self.run_policy.restart_strategy == "InPlace"
            and self.launcher == "torchrun"
            and self.holds_the_trainer
            and not (self.command and own_command.starts_a_launcher(list(self.command)))
        )

    @property
    def topology(self) -> TopologyPolicy | None:
        return self.scheduling.topology if self.scheduling is not None else None

    @property
    def gang_min_member(self) -> int | None:
        """The gang's size as written (None without a gang or without minMember)."""
        gang = self.scheduling.gang if self.scheduling is not None else None
        return gang.min_member if gang is not None else None

    @property
    def runs_as_root(self) -> bool:
        """Whether the template runs a container as root (runAsUser 0)."""
        template = self.template
        contexts = [
            template.security_context or {},
            template.container.security_context or {},
            *(c.get("securityContext") or {} for c in template.init_containers),
        ]
        return any(c.get("runAsUser") == 0 for c in contexts)

    @property
    def ssh_dir(self) -> str:
        """Where the MPI Operator mounts the ssh keys: mpi.sshAuthMountPath, else the .ssh
        of the user the template runs as."""
        if self.mpi is not None and self.mpi.ssh_auth_mount_path is not None:
            return self.mpi.ssh_auth_mount_path
        return ROOT_SSH_DIR if self.runs_as_root else TRAINER_SSH_DIR

    @property
    def procs_per_node(self) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        if self.accelerator.type == "cpu":
            return 1
        return self.accelerator.per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes: the node count, or elastic's "min:max"."""
        if self.elastic is not None:
            return f"{self.elastic.min_nodes}:{self.elastic.max_nodes}"
        return str(self.nodes)

    @model_validator(mode="after")
    def _command_runs_as_written(self) -> Any:
        """A pasted launcher line or shell variable would start and then die in every pod:
        refused here (render, and the operator before it creates anything), saying the line to
        write. Not a CEL rule: the server's cost budget cannot scan every word of every arg."""
        if self.command is None:
            return self
        command = list(self.command)
        args = list(self.args or [])
        problems = own_command.launcher_problems(
            command + args,  # a torchrun line may continue in args
            launcher=self.launcher,
            nnodes=self.nnodes,
            procs_per_node=self.procs_per_node,
            pods=self.elastic.max_nodes if self.elastic is not None else self.nodes,
        ) or own_command.unexpanded_variables(command, args)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return ACCELERATOR_BACKENDS[self.accelerator.type]


# What a live job may change; every other field of the spec is kept, since its running group
# was built from it (a new field is immutable unless added here). runPolicy may change (suspend,
# deadline, TTL, backoff); template only while suspended, when Kueue writes node selectors (its
# own rule in `transition_rules`). Only the API server knows the old object, so these rules are
# CEL alone.
MUTABLE_SPEC_FIELDS = ("runPolicy", "template")
IMMUTABLE_SPEC_FIELDS = tuple(
    alias
    for field in DDPTrainingJobSpec.model_fields.values()
    if (alias := field.alias) is not None and alias not in MUTABLE_SPEC_FIELDS
)


def _unchanged(field: str) -> str:
    return (
        f"has(self.{field}) == has(oldSelf.{field}) && "
        f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
    )


def transition_rules() -> list[dict[str, str]]:
    """CEL rules on spec updates: what may not change once the job exists."""
    rules = [
        {
            "rule": _unchanged(field),
            "message": f"spec.{field} cannot change on an existing job: delete the job and "
            "create it again (checkpoints let it resume)",
        }
        for field in IMMUTABLE_SPEC_FIELDS
    ]
    rules.append(
        {
            "rule": "(has(oldSelf.runPolicy) && has(oldSelf.runPolicy.suspend) && "
            "oldSelf.runPolicy.suspend) || " + _unchanged("template"),
            "message": "spec.template can change only while the job is suspended "
            "(runPolicy.suspend: true)",
        }
    )
    return rules


# --- status -------------------------------------------------------------------------------

Phase = Literal["Pending", "Starting", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
ConditionType = Literal[
    "Created",
    "Running",
    "Restarting",
    "Succeeded",
    "Failed",
    "Suspended",
    "Schedulable",
    "ContainersStarted",
    "Straggler",
    "ReconcileFailing",
]


Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Step = Annotated[int, Field(ge=0, le=contract.MAX_INT)]
Epochs = Annotated[int, Field(ge=0, le=contract.MAX_EPOCHS)]
Rank = Annotated[int, Field(ge=0, le=MAX_COUNT)]
ExitCode = Annotated[int, Field(ge=MIN_EXIT_CODE, le=MAX_EXIT_CODE)]
Metric = Annotated[float, Field(ge=-contract.MAX_METRIC, le=contract.MAX_METRIC)]
Rate = Annotated[float, Field(ge=0, le=contract.MAX_METRIC)]
Share = Annotated[float, Field(ge=0, le=1)]
Seconds = Annotated[int, Field(ge=0, le=MAX_SECONDS)]


def _cut_to(max_length: int) -> Callable[[Any], Any]:
    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > max_length:
            return value[: max_length - 1] + "…"
        return value

    return cut


# Status strings are cut to their maxLength as they are set: what the operator copies from
# pods and the cluster (a termination message, the scheduler's words) the API server would
# refuse whole.
ReasonText = Annotated[str, BeforeValidator(_cut_to(MAX_REASON)), Field(max_length=MAX_REASON)]
Message = Annotated[
    str,
    BeforeValidator(_cut_to(contract.MESSAGE_LENGTH)),
    Field(max_length=contract.MESSAGE_LENGTH),
]
PodOrNode = Annotated[str, BeforeValidator(_cut_to(253)), Field(max_length=253)]


class StatusModel(Model):
    """Status is written by the operator and by the trainer; tolerate keys of other versions.
    A pod may write it, so every number is finite and every time has a zone and a UTC value."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _times_in_utc(cls, value: Any) -> Any:
        if not isinstance(value, datetime):
            return value
        if value.tzinfo is None:
            raise ValueError("a time needs a zone (RFC 3339: Z or an offset)")
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("a time out of the range of dates") from None


class Condition(StatusModel):
    """A Kubernetes-style condition."""

    type: ConditionType = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: ReasonText | None = Field(None, description="One-word CamelCase reason.")
    message: Message | None = Field(None, description="Human-readable details.")
    last_transition_time: datetime | None = Field(None, description="When the status last changed.")


class WorkerCounts(StatusModel):
    """Worker pods of the current attempt, by phase."""

    total: Count = Field(0, description="Worker pods the job runs.")
    pending: Count = Field(0, description="Pods not yet running.")
    running: Count = Field(0, description="Pods running.")
    succeeded: Count = Field(0, description="Pods that exited 0.")
    failed: Count = Field(0, description="Pods that failed.")


class Failure(StatusModel):
    """The first failure of the last attempt."""

    pod: PodOrNode | None = Field(None, description="The failed worker pod.")
    node: PodOrNode | None = Field(None, description="The node it ran on, where known.")
    rank: Rank | None = Field(
        None, description="The global rank that stopped first (a hang the trainer traced)."
    )
    exit_code: ExitCode | None = Field(None, description="Its exit code, if it ran.")
    reason: ReasonText | None = Field(
        None, description="Why it failed (Error, OOMKilled, Evicted...)."
    )
    message: Message | None = Field(None, description="Details.")


class CheckpointProgress(StatusModel):
    """The newest checkpoint the trainer completed."""

    step: Step | None = Field(None, description="The step it was taken at.")
    epoch: Epochs | None = Field(None, description="The epoch it was taken in.")
    saved_at: datetime | None = Field(None, description="When it was complete.")
    save_seconds: float | None = Field(
        None,
        ge=0,
        le=MAX_SAVE_SECONDS,
        description="How long the save took: the operator fits the workers' grace period to it.",
    )


class StallCheck(StatusModel):
    """What rank 0 of the trainer found in the group's store when the group made no step for a
    heartbeat's interval: the rank the others wait on, or none (every rank even and heard
    from: a long validation, or a collective all of them wait in)."""

    rank: Rank | None = Field(None, description="The suspect's global rank.")
    pod: PodOrNode | None = Field(None, description="Its pod.")
    node: PodOrNode | None = Field(None, description="Its node.")
    step: Step | None = Field(None, description="The last training step it made.")
    message: Message | None = Field(None, description="What was found, and how it is known.")
    checked_at: datetime | None = Field(None, description="When rank 0 found it.")


class StragglerReport(StatusModel):
    """A rank whose own part of each step (its forward pass) stays slower than the others', as
    rank 0 of the trainer finds it in the group's store: the group waits for it at every
    all-reduce."""

    rank: Rank | None = Field(None, description="Its global rank.")
    pod: PodOrNode | None = Field(None, description="Its pod.")
    node: PodOrNode | None = Field(None, description="Its node.")
    slower_by: Rate | None = Field(
        None, description="Its time over the median of the other ranks' (1.5 and more)."
    )
    message: Message | None = Field(None, description="What was measured.")
    checked_at: datetime | None = Field(None, description="When rank 0 found it.")


class TrainingProgress(StatusModel):
    """Live progress, reported by rank 0 of the trainer after each epoch and, within one, every
    heartbeat."""

    attempt: Count | None = Field(
        None,
        description="The attempt (KUBEDDP_ATTEMPT) of the rank 0 that reported: a report of "
        "another attempt than status.attempt is refused (the status policy) or not taken as "
        "progress.",
    )
    epoch: Epochs | None = Field(None, description="Epochs completed.")
    epochs: Epochs | None = Field(None, description="Epochs planned.")
    loss: Metric | None = Field(None, description="Training loss of the last epoch.")
    val_loss: Metric | None = Field(None, description="Validation loss of the last epoch.")
    val_accuracy: Share | None = Field(None, description="Validation accuracy (0-1).")
    best_val_accuracy: Share | None = Field(None, description="Best validation accuracy so far.")
    images_per_sec: Rate | None = Field(None, description="Training throughput, all ranks.")
    step: Step | None = Field(None, description="Steps done in the epoch under way.")
    steps_per_epoch: Step | None = Field(None, description="Steps in one epoch.")
    world_size: Count | None = Field(
        None, description="Ranks training now: fewer than planned while an elastic job is short."
    )
    progress_percentage: Annotated[int, Field(ge=0, le=100)] | None = Field(
        None, description="How much of the planned training is done (0-100)."
    )
    estimated_remaining_seconds: Seconds | None = Field(
        None, description="The time left at the current speed."
    )
    updated_at: datetime | None = Field(None, description="When rank 0 last reported.")
    checkpoint: CheckpointProgress | None = Field(None, description="The newest checkpoint.")
    resumed_from_step: Step | None = Field(
        None, description="The step this attempt resumed from (its checkpoint's)."
    )
    longest_report_gap_seconds: float | None = Field(
        None,
        ge=0,
        le=MAX_SECONDS,
        description="The longest time between two of rank 0's reports, once an epoch ended: "
        "the default progress deadline is learned from it.",
    )
    stall: StallCheck | None = Field(
        None, description="What rank 0 found when the group last stalled."
    )
    straggler: StragglerReport | None = Field(
        None, description="A rank the group waits for at every step, while it is one."
    )


class RankRestart(StatusModel):
    """An in-place restart, as the pod agent (ddp_trainer.torchrun) that restarted its ranks
    reports it: written by that agent, read by the operator, which counts it in restarts."""

    attempt: Count | None = Field(None, description="The attempt (KUBEDDP_ATTEMPT) it restarted.")
    count: Count | None = Field(
        None, description="In-place restarts of that attempt so far, this one included."
    )
    time: datetime | None = Field(None, description="When the agent restarted its ranks.")
    pod: PodOrNode | None = Field(None, description="The pod whose rank failed.")
    node: PodOrNode | None = Field(None, description="The node that pod runs on.")
    rank: Rank | None = Field(None, description="The global rank that failed.")
    exit_code: ExitCode | None = Field(
        None, description="How it ended: its exit code, or 128 + the signal that killed it."
    )
    message: Message | None = Field(None, description="The agent's words on it.")


class Preemption(StatusModel):
    """A preemption: the group was stopped from outside (a drain, an eviction, the scheduler, a
    suspend, Kueue) and resumes, no restart counted."""

    time: datetime | None = Field(None, description="When the operator saw it.")
    reason: ReasonText | None = Field(
        None,
        description="By what: the pod's DisruptionTarget reason (EvictionByEvictionAPI for a "
        "drain, PreemptionByScheduler, DeletionByTaintManager, TerminationByKubelet), Deleted, "
        "Terminated (a SIGTERM Kubernetes gave no reason for), Suspended, or Kueue's Preempted "
        "or Evicted.",
    )
    message: Message | None = Field(None, description="Details: the pod, and Kubernetes' words.")
    checkpoint_step: Step | None = Field(
        None, description="The step of the newest checkpoint the trainer had reported by then."
    )
    resumed_from_step: Step | None = Field(
        None, description="The step the next attempt resumed from, once its trainer reports it."
    )


class AvoidedNode(StatusModel):
    """A node a worker was lost to (its node stopped reporting, or evicted it under pressure):
    the next pods prefer other nodes until `until`."""

    node: PodOrNode = Field(description="The node.")
    reason: ReasonText | None = Field(
        None, description="What the worker's loss was (NodeLost, Evicted)."
    )
    until: datetime | None = Field(None, description="When the next pods may prefer it again.")


# The nodes status.avoidedNodes keeps, the newest: the next pods' affinity names each.
MAX_AVOIDED_NODES = 64
# The bounds of status.trainingHistory: a curve a terminal can show, a few KiB of the object.
HISTORY_POINTS = 100
HISTORY_MARKS = 20


class EpochPoint(StatusModel):
    """One epoch's figures, as rank 0 reported them at the epoch's end."""

    epoch: Epochs = Field(description="Epochs completed.")
    loss: Metric | None = Field(None, description="Training loss of the epoch.")
    val_loss: Metric | None = Field(None, description="Validation loss after it.")
    val_accuracy: Share | None = Field(None, description="Validation accuracy after it (0-1).")


class CurveMark(StatusModel):
    """A restart or a preemption, where the curve was when it happened."""

    epoch: float = Field(
        ge=0,
        le=contract.MAX_EPOCHS,
        description="Epochs done when it happened (a fraction: steps into the next).",
    )
    kind: Literal["Restart", "Preemption"] = Field(description="Restart or Preemption.")


class TrainingHistory(StatusModel):
    """The run's curve, kept by the operator from rank 0's reports of each epoch's end: at most
    HISTORY_POINTS points, thinned to every other one (the newest kept) when full."""

    points: list[EpochPoint] = Field(
        default_factory=list,
        max_length=HISTORY_POINTS,
        description="Epochs by number; a resumed run replaces those it trains again.",
    )
    marks: list[CurveMark] = Field(
        default_factory=list,
        max_length=HISTORY_MARKS,
        description="Restarts and preemptions, oldest first (the newest kept).",
    )


class JobStatus(StatusModel):
    """Observed state of a DDPTrainingJob."""

    phase: Phase | None = Field(
        None,
        description="Pending, Starting, Running, Restarting, Succeeded, Failed or Suspended.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=len(typing.get_args(ConditionType)),
        description="Created, Running, Restarting, Succeeded, Failed, Suspended and "
        "Schedulable conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    workers: WorkerCounts | None = Field(None, description="Worker pods by phase.")
    restarts: Count = Field(
        0,
        description="Restarts so far, of every kind: group restarts, ranks restarted in place, "
        "lost pods replaced.",
    )
    attempt: Count | None = Field(
        None,
        description="The group's attempt: its pods' label and MASTER_PORT (port + attempt). A "
        "group restart starts the next; a restart in place or a replaced pod keeps it. Unset: "
        "restarts.",
    )
    in_place_restarts: Count = Field(
        0,
        description="Restarts in place of this attempt counted in restarts (rankRestart.count "
        "seen so far).",
    )
    replacing: list[Annotated[int, Field(ge=1, lt=MAX_NODES)]] = Field(
        default_factory=list,
        max_length=MAX_NODES,
        description="Workers (indices) of this attempt being replaced alone, already counted.",
    )
    preemptions: Count = Field(
        0,
        description="Times the group was preempted and resumed (never counted as restarts).",
    )
    last_preemption: Preemption | None = Field(None, description="The newest preemption.")
    start_time: datetime | None = Field(None, description="When the job was first started.")
    completion_time: datetime | None = Field(None, description="When the job finished.")
    observed_generation: Annotated[int, Field(ge=0, le=contract.MAX_INT)] | None = Field(
        None, description="The spec generation this status reflects."
    )
    failure: Failure | None = Field(None, description="The first failure of the last attempt.")
    training: TrainingProgress | None = Field(
        None, description="Training progress reported by the trainer."
    )
    rank_restart: RankRestart | None = Field(
        None, description="The newest in-place restart, as the pod agent that made it reports it."
    )
    training_history: TrainingHistory | None = Field(
        None,
        description="The run's curve by epoch, restarts and preemptions marked (`kube-ddp "
        "describe` plots it).",
    )
    avoided_nodes: list[AvoidedNode] = Field(
        default_factory=list,
        max_length=MAX_AVOIDED_NODES,
        description="Nodes workers were lost to, which the next pods prefer not to run on "
        "for a while (they still go there when no other node fits).",
    )

    @property
    def current_attempt(self) -> int:
        """The attempt the pods run under: `attempt`, or `restarts` where no attempt was
        written (every restart was a group restart)."""
        return self.attempt if self.attempt is not None else self.restarts


# --- the whole object -----------------------------------------------------------------------


NAME_MESSAGE = (
    f"must be a DNS label of at most {MAX_NAME_LENGTH} characters (lower-case "
    "letters, digits and '-', starting with a letter) so that the worker hostnames fit"
)


class ObjectMeta(BaseModel):
    """The metadata a job file needs; other Kubernetes metadata passes through untouched."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @field_validator("name")
    @classmethod
    def _fits_hostnames(cls, name: str) -> str:
        # The CRD says the same with maxLength and pattern on metadata.name.
        if len(name) > MAX_NAME_LENGTH or not re.fullmatch(NAME_PATTERN, name):
            raise ValueError(NAME_MESSAGE)
        return name

    name: str = Field(min_length=1)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class DDPTrainingJob(Model):
    """A DDPTrainingJob object as found in a job file or read from the API server."""

    api_version: Literal["kubeddp.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["DDPTrainingJob"]
    metadata: ObjectMeta
    spec: DDPTrainingJobSpec
    status: JobStatus | None = None

    @field_validator("spec", mode="wrap")
    @classmethod
    def _typed_as_the_api_server_does(cls, value: Any, handler: Any) -> Any:
        """Strict types, nulls as unset: `render` accepts exactly what the server accepts
        (kube_ddp.server_input). Only the spec: status comes from the server, already typed,
        with timestamps as strings."""
        if isinstance(value, DDPTrainingJobSpec):
            return value
        return DDPTrainingJobSpec.model_validate(
            as_the_server_reads(value, DDPTrainingJobSpec),
            strict=True,
            by_alias=True,  # camelCase, as in a job file and on the server
            by_name=False,
        )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


def load_job(document: Any, namespace: str | None = None) -> DDPTrainingJob:
    """Validate one parsed document as a DDPTrainingJob, optionally placing it in `namespace`."""
    job = DDPTrainingJob.model_validate(document, by_alias=True, by_name=False)
    if namespace is not None:
        job = job.model_copy(
            update={"metadata": job.metadata.model_copy(update={"namespace": namespace})}
        )
    return job
