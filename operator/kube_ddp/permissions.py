"""The operator's own RBAC rules, each with the code path that needs it: the one home of them.

The Helm chart's ClusterRole (all namespaces) or Roles (one per watched namespace) are written
from `JOB_RULES` by `make manifests` (hack/chart.py), and the leader-election Role in the
operator's namespace from `lease_rules`. Nothing here is a wildcard, and no rule touches
Secrets. Tests hold the list to the code: every kind the operator creates (kube.PLURALS) has
its `create` rule, and the cluster tier runs the operator with exactly these rights.
"""

from __future__ import annotations

from dataclasses import dataclass

from kube_ddp import gang, kueue, names

RBAC_GROUP = "rbac.authorization.k8s.io"
MPI_GROUP = "kubeflow.org"


@dataclass(frozen=True)
class Rule:
    """One PolicyRule, why the operator needs it, and the chart value that turns it off."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    resource_names: tuple[str, ...] = ()
    only_if: str | None = None  # a boolean chart value (e.g. "rbac.mpiJobs")

    def policy_rule(self) -> dict[str, list[str]]:
        rule = {
            "apiGroups": [self.api_group],
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }
        if self.resource_names:
            rule["resourceNames"] = list(self.resource_names)
        return rule


# Rights in every watched namespace (cluster-wide in all-namespaces mode).
# Kube.create reads the object of a name taken (409 AlreadyExists) to tell the job's own, made
# by an earlier reconcile, from another's.
CONFLICT_WHY = (
    "a create answered 409 (AlreadyExists): the object of that name read to tell this job's "
    "own from another's: Kube.create"
)

JOB_RULES: tuple[Rule, ...] = (
    Rule(
        names.GROUP,
        (names.PLURAL,),
        ("list", "watch"),
        "kopf's watch of jobs: handlers.job_event (kopf.on.event)",
    ),
    Rule(
        names.GROUP,
        (names.PLURAL,),
        ("delete",),
        "ttlSecondsAfterFinished: Controller._act(DeleteJob) -> Kube.delete_job",
    ),
    Rule(
        names.GROUP,
        (f"{names.PLURAL}/status",),
        ("patch",),
        "status writes: Controller._apply -> Kube.patch_job_status",
    ),
    Rule(
        names.GROUP,
        (f"{names.PLURAL}/status",),
        ("get",),
        "not called: the per-job reporter Role grants get and patch on the job's status, and "
        "Kubernetes lets a Role be created only by one who holds what it grants",
    ),
    Rule(
        names.GROUP,
        (f"{names.PLURAL}/finalizers",),
        ("update",),
        "children carry an ownerReference with blockOwnerDeletion (kopf.adopt); the "
        "OwnerReferencesPermissionEnforcement admission plugin, where enabled, asks for this",
    ),
    Rule(
        "",
        ("pods",),
        ("list", "watch"),
        "kopf's watch of the workers: handlers.ddp_pods and handlers.mpi_pods (kopf.index), "
        "handlers.pod_event",
    ),
    Rule(
        "",
        ("pods",),
        ("create", "delete"),
        "workers: Controller._act(CreateWorkers) -> Kube.create; group restarts, "
        "cleanPodPolicy, suspend: Controller._act(DeletePods) -> Kube.delete_pod",
    ),
    Rule(
        "",
        ("services",),
        ("create",),
        "Controller._act(CreateWorkers) -> Kube.create(launchers.torchrun.build_service)",
    ),
    Rule(
        "",
        ("serviceaccounts",),
        ("create",),
        "the reporter account: Controller._act(CreateWorkers) -> Kube.create(build_reporter_rbac)",
    ),
    Rule(
        RBAC_GROUP,
        ("roles", "rolebindings"),
        ("create",),
        "the reporter Role and RoleBinding: Controller._act(CreateWorkers) -> "
        "Kube.create(build_reporter_rbac)",
    ),
    Rule(
        names.NETWORK_POLICY_API_VERSION.rpartition("/")[0],
        (names.NETWORK_POLICY_PLURAL,),
        ("create",),
        "the job's NetworkPolicy: Controller._act(CreateWorkers) -> "
        "Kube.create(builders.build_network_policy)",
    ),
    Rule(
        "",
        ("pods", "services", "serviceaccounts"),
        ("get",),
        CONFLICT_WHY,
    ),
    Rule(
        RBAC_GROUP,
        ("roles", "rolebindings"),
        ("get",),
        CONFLICT_WHY,
    ),
    Rule(
        names.NETWORK_POLICY_API_VERSION.rpartition("/")[0],
        (names.NETWORK_POLICY_PLURAL,),
        ("get",),
        CONFLICT_WHY,
    ),
    Rule(
        "",
        ("events",),
        ("create",),
        "Events on jobs: Controller._apply -> Kube.create(builders.build_event); kopf's posting",
    ),
    Rule(
        "",
        ("events",),
        ("list",),
        "a worker still creating its containers: Controller._with_mount_failures -> "
        "Kube.newest_event_message (the kubelet's FailedMount, said nowhere in the pod)",
    ),
    *(
        Rule(
            kind.api_version.rpartition("/")[0],
            (kind.plural,),
            ("create", "get"),
            f"spec.scheduling.gang.scheduler {scheduler}: Controller._act(CreateWorkers) -> "
            "Kube.create(gang.build_pod_group) (get: a create answered 409)",
        )
        for scheduler, kind in gang.KINDS.items()
    ),
    Rule(
        names.GROUP,
        (names.PLURAL,),
        ("patch",),
        "Kueue: suspend a queued or evicted job, apply an admission and resume it: "
        "Controller._apply_kueue -> Kube.patch_job",
        only_if="rbac.kueue",
    ),
    Rule(
        kueue.GROUP,
        (kueue.WORKLOADS,),
        ("get", "list", "watch", "create"),
        "Kueue: the job's Workload (kueue.build_workload), read on every reconcile of a queued "
        "job; handlers.workload_event watches ours",
        only_if="rbac.kueue",
    ),
    Rule(
        kueue.GROUP,
        (f"{kueue.WORKLOADS}/status",),
        ("patch",),
        "Kueue: release an evicted Workload's quota, mark it Finished: Controller._apply_kueue -> "
        "Kube.patch_workload_status",
        only_if="rbac.kueue",
    ),
    Rule(
        MPI_GROUP,
        ("mpijobs",),
        ("create", "get", "delete", "patch"),
        "launcher mpi: Controller._act(CreateWorkers) -> Kube.create(launchers.mpi.build_mpijob) "
        "(get: a create answered 409); a group restart: Kube.delete_mpijob; suspend and resume: "
        "Kube.suspend_mpijob",
        only_if="rbac.mpiJobs",
    ),
    Rule(
        MPI_GROUP,
        ("mpijobs",),
        ("list", "watch"),
        "launcher mpi: the status mirror, handlers.mpijob_event",
        only_if="rbac.mpiJobs",
    ),
)


# Rights on cluster-scoped objects, which a namespace's Role cannot grant: a ClusterRole of
# their own in namespaced mode, part of the ClusterRole otherwise.
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(
        kueue.GROUP,
        (kueue.RESOURCE_FLAVORS, kueue.PRIORITY_CLASSES),
        ("get",),
        "Kueue: the admitted ResourceFlavors' node labels and tolerations, a "
        "WorkloadPriorityClass's value for a new Workload: Controller._apply_kueue",
        only_if="rbac.kueue",
    ),
    Rule(
        kueue.POD_PRIORITY_GROUP,
        ("priorityclasses",),
        ("get",),
        "Kueue: the pods' PriorityClass value for a new Workload when no WorkloadPriorityClass "
        "is named: Controller._apply_kueue",
        only_if="rbac.kueue",
    ),
)


def lease_rules(lease_name: str) -> tuple[Rule, ...]:
    """Rights in the operator's own namespace, for leader election (leadership.LeaseElector)."""
    return (
        Rule(
            "coordination.k8s.io",
            ("leases",),
            ("get", "update"),
            "read and renew (or take over) the leader Lease (LeaseElector)",
            resource_names=(lease_name,),
        ),
        Rule(
            "coordination.k8s.io",
            ("leases",),
            ("create",),
            "create the Lease the first time (a create cannot be limited to one name)",
        ),
    )
