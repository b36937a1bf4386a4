"""The Helm chart with the real helm binary and the real API server: lint, rendering in every
mode validated strictly, bad values refused clearly, the plain-YAML install current, install /
upgrade / uninstall, and the chart's ServiceAccount both sufficient and least privilege."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest

from kube_ddp import cli, names
from kube_ddp.permissions import CLUSTER_RULES
from tests.cluster.helm_support import (
    CHART,
    TEST_IMAGE,
    Helm,
    Operator,
    service_account_kubeconfig,
)
from tests.cluster.operator_support import Jobs, job_manifest, service_account_token
from tests.cluster.support import REPO, Cluster, fresh_namespace, wait_for

KUBERNETES_VERSION = "1.36.0"
GPU_2X8 = {"nodes": 2, "accelerator": {"type": "nvidia", "perNode": 8}}

COMBINATIONS: dict[str, list[str]] = {
    "defaults": [],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}"],
    "three-replicas": ["--set", "replicaCount=3"],
    "no-leader-election": ["--set", "leaderElection.enabled=false"],
    "service-monitor": [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
    ],
    "operations-kit": [
        "--set",
        "operations.dashboard.enabled=true",
        "--set",
        "operations.dashboard.namespace=monitoring",
        "--set",
        "operations.prometheusRule.enabled=true",
        "--set",
        "operations.prometheusRule.labels.release=prometheus",
    ],
    "existing-account-no-rbac": [
        "--set",
        "rbac.create=false",
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=ops",
    ],
    "no-mpi-no-metrics-service": [
        "--set",
        "rbac.mpiJobs=false",
        "--set",
        "metrics.service.enabled=false",
    ],
    "every-option": [
        "--set",
        "operator.trainerImage=registry.example/trainer:1",
        "--set",
        "operator.logFormat=plain",
        "--set",
        "operator.verbose=true",
        "--set",
        "operator.workers=32",
        "--set",
        "image.tag=dev",
        "--set",
        "imagePullSecrets[0].name=pull",
        "--set",
        "nodeSelector.pool=system",
        "--set",
        "tolerations[0].key=dedicated",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "podAnnotations.team=ml",
        "--set",
        "podLabels.tier=control",
        "--set",
        "priorityClassName=system-cluster-critical",
        "--set",
        "serviceAccount.annotations.owner=ml",
    ],
}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_helm_lint(helm: Helm) -> None:
    result = helm.run("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_two_releases_shard_the_namespaces_without_a_clash(helm: Helm) -> None:
    """docs/install.md, "More than one operator process": two releases in one namespace, each
    watching namespaces of its own, share no object (the CRD is in crds/, which Helm installs
    once and skips when present) and campaign for Leases of their own."""
    shards = {"shard-a": "team-a,team-b", "shard-b": "team-c"}
    rendered = {
        release: helm.template(f"--set=watchNamespaces={{{watched}}}", release=release)
        for release, watched in shards.items()
    }

    def keys(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        return {
            (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects
        }

    assert not keys(rendered["shard-a"]) & keys(rendered["shard-b"])
    flags = {}
    for release, objects in rendered.items():
        (deployment,) = by_kind(objects, "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        flags[release] = container["args"]
        roles = {
            (r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(objects, "Role")
        }
        watched = shards[release].split(",")
        assert {ns for ns, _ in roles} >= set(watched)
    leases = {
        next(a for a in args if a.startswith("--leader-election-id=")) for args in flags.values()
    }
    assert len(leases) == 2
    assert "--namespace=team-c" in flags["shard-b"] and "--namespace=team-a" not in flags["shard-b"]


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_template_is_valid(helm: Helm, combination: str) -> None:
    args = COMBINATIONS[combination]
    objects = helm.template("--include-crds", *args)
    for obj in objects:
        if obj["kind"] in {"ServiceMonitor", "PrometheusRule"}:  # not Kubernetes kinds: below
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role"):
        for rule in role["rules"]:
            assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule["verbs"]]
            assert "secrets" not in rule["resources"]
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args_ = container["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["limits"]["memory"]
    election = "--leader-election" in args_
    assert election is (combination != "no-leader-election")
    assert deployment["spec"]["strategy"]["type"] == ("RollingUpdate" if election else "Recreate")

    if combination == "namespaced":
        # Only the cluster-scoped reads of Kueue's contract (rbac.kueue) are cluster-wide.
        (cluster_role,) = by_kind(objects, "ClusterRole")
        assert cluster_role["rules"] == [rule.policy_rule() for rule in CLUSTER_RULES]
        assert {v for r in cluster_role["rules"] for v in r["verbs"]} == {"get"}
        roles = {
            (r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(objects, "Role")
        }
        assert roles == {
            ("team-a", "kube-ddp"),
            ("team-b", "kube-ddp"),
            ("kube-ddp", "kube-ddp-leader-election"),
        }
        assert "--namespace=team-a" in args_ and "--namespace=team-b" in args_
        assert "--all-namespaces" not in args_
    elif combination == "existing-account-no-rbac":
        assert not by_kind(objects, "ServiceAccount")
        assert not [o for o in objects if o["apiVersion"].startswith("rbac.")]
        assert pod["serviceAccountName"] == "ops"
    else:
        assert "--all-namespaces" in args_
        (cluster_role,) = by_kind(objects, "ClusterRole")
        mpi = any("mpijobs" in r["resources"] for r in cluster_role["rules"])
        assert mpi is (combination != "no-mpi-no-metrics-service")
    if combination == "three-replicas":
        assert deployment["spec"]["replicas"] == 3
        (budget,) = by_kind(objects, "PodDisruptionBudget")
        assert budget["spec"]["minAvailable"] == 1
    else:
        assert not by_kind(objects, "PodDisruptionBudget")
    if combination == "service-monitor":
        (monitor,) = by_kind(objects, "ServiceMonitor")
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    else:
        assert not by_kind(objects, "ServiceMonitor")
    if combination == "operations-kit":
        (dashboard,) = by_kind(objects, "ConfigMap")
        assert dashboard["metadata"]["namespace"] == "monitoring"
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        (rule,) = by_kind(objects, "PrometheusRule")
        assert rule["metadata"]["labels"]["release"] == "prometheus"
    else:  # the operations kit is off by default
        assert not by_kind(objects, "ConfigMap") and not by_kind(objects, "PrometheusRule")
    if combination == "no-mpi-no-metrics-service":
        assert not by_kind(objects, "Service")
    if combination == "every-option":
        assert container["image"] == "ghcr.io/kube-ddp/kube-ddp-operator:dev"
        assert {"--trainer-image=registry.example/trainer:1", "--log-format=plain"} <= set(args_)
        assert {"--verbose", "--workers=32"} <= set(args_)
        assert pod["nodeSelector"] == {"pool": "system"}
        assert pod["imagePullSecrets"] == [{"name": "pull"}]
        assert deployment["spec"]["template"]["metadata"]["annotations"] == {"team": "ml"}
    if combination == "defaults":
        version = (REPO / "operator" / "pyproject.toml").read_text().split('version = "')[1]
        assert container["image"].endswith(":" + version.split('"')[0])
        assert "--log-format=json" in args_
        assert not any(a.startswith("--trainer-image") for a in args_)


BAD_VALUES = {
    "replicaCount=0": "at '/replicaCount': minimum: got 0, want 1",
    "replicas=2": "additional properties 'replicas' not allowed",
    "watchNamespaces={Team_A}": "at '/watchNamespaces/0': 'Team_A' does not match pattern",
    "operator.logFormat=xml": "at '/operator/logFormat': value must be one of 'json', 'plain'",
    "operator.workers=lots": "at '/operator/workers': got string, want integer",
    "image.pullPolicy=Sometimes": "at '/image/pullPolicy': value must be one of 'Always'",
    "leaderElection.leaseDuration=0": "at '/leaderElection/leaseDuration': exclusiveMinimum",
    "leaderElection.retryPeriod=20": "need retryPeriod < renewDeadline < leaseDuration",
    "metrics.port=8080": "operator.healthPort and metrics.port must differ",
    "replicaCount=2,leaderElection.enabled=false": (
        "replicaCount=2 needs leaderElection.enabled=true: without the Lease every replica"
    ),
    "serviceAccount.create=false": "serviceAccount.name: name an existing ServiceAccount",
    "metrics.service.enabled=false,metrics.serviceMonitor.enabled=true": (
        "metrics.serviceMonitor.enabled needs metrics.service.enabled"
    ),
}


@pytest.mark.parametrize("values", list(BAD_VALUES))
def test_bad_values_fail_with_a_clear_message(helm: Helm, values: str) -> None:
    result = helm.run(
        "template", "x", str(CHART), "--kube-version=1.36.0", "--set", values, check=False
    )
    assert result.returncode != 0
    assert BAD_VALUES[values] in result.stderr


def test_bad_values_fail_helm_install(helm: Helm, namespace: str) -> None:
    """The real install refuses them too, before anything is created."""
    result = helm.run(
        "install",
        "bad",
        str(CHART),
        "-n",
        namespace,
        "--set",
        "operator.logFormat=xml",
        check=False,
    )
    assert result.returncode != 0
    assert "at '/operator/logFormat': value must be one of" in result.stderr
    assert helm.run("list", "-n", namespace, "-q").stdout.strip() == ""


def test_install_yaml_is_current(helm: Helm) -> None:
    chart_tool = load_chart_tool()
    assert (REPO / "manifests" / "install.yaml").read_text() == chart_tool.install_yaml(
        helm.binary
    ), "manifests/install.yaml is stale: make manifests"


def load_chart_tool() -> Any:
    from tests.unit.test_chart_files import load_chart_tool as load

    return load()


def test_install_yaml_passes_server_dry_run(cluster: Cluster) -> None:
    result = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        f"--filename={REPO / 'manifests' / 'install.yaml'}",
        check=False,
    )
    # The namespace does not exist in a dry run, so its objects are refused for that alone.
    errors = [
        line for line in result.stderr.splitlines() if 'namespaces "kube-ddp" not found' not in line
    ]
    assert errors == [], result.stderr
    assert (
        "customresourcedefinition.apiextensions.k8s.io/ddptrainingjobs.kubeddp.io" in result.stdout
    )


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    """A second fresh namespace (the jobs' one, apart from the operator's)."""
    with fresh_namespace(cluster, f"jobs-{uuid.uuid4().hex[:8]}") as name:
        yield name


def release_name() -> str:
    return f"kddp-{uuid.uuid4().hex[:6]}"


def test_install_upgrade_uninstall(
    cluster: Cluster, helm: Helm, crd: None, namespace: str, other_namespace: str
) -> None:
    release = release_name()
    fullname = f"{release}-kube-ddp"
    started = time.monotonic()
    helm.run(
        "install", release, str(CHART), "-n", namespace, *TEST_IMAGE, "--wait", "--timeout=60s"
    )
    print(f"helm install --wait: {time.monotonic() - started:.1f} s")
    apps = kubernetes.client.AppsV1Api(cluster.api)
    deployment = apps.read_namespaced_deployment(fullname, namespace)
    assert deployment.status.ready_replicas == 1
    cluster.rbac.read_cluster_role(fullname)
    cluster.rbac.read_namespaced_role(f"{fullname}-leader-election", namespace)
    cluster.core.read_namespaced_service(f"{fullname}-metrics", namespace)

    started = time.monotonic()
    helm.run(
        "upgrade",
        release,
        str(CHART),
        "-n",
        namespace,
        *TEST_IMAGE,
        "--set",
        "replicaCount=2",
        "--set",
        "operator.logFormat=plain",
        "--wait",
        "--timeout=60s",
    )
    print(f"helm upgrade --wait: {time.monotonic() - started:.1f} s")
    deployment = apps.read_namespaced_deployment(fullname, namespace)
    assert deployment.spec.replicas == 2
    assert "--log-format=plain" in deployment.spec.template.spec.containers[0].args
    assert "REVISION: 2" in helm.run("status", release, "-n", namespace).stdout

    jobs = Jobs(cluster, other_namespace)
    jobs.create(job_manifest("keep", **GPU_2X8))
    started = time.monotonic()
    helm.run("uninstall", release, "-n", namespace, "--wait", "--timeout=60s")
    print(f"helm uninstall --wait: {time.monotonic() - started:.1f} s")
    with pytest.raises(kubernetes.client.ApiException) as gone:
        cluster.rbac.read_cluster_role(fullname)
    assert gone.value.status == 404
    wait_for(lambda: not apps.list_namespaced_deployment(namespace).items, "the Deployment to go")
    # crds/ is never deleted by Helm: the CRD and the jobs stay.
    kubernetes.client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(
        f"{names.PLURAL}.{names.GROUP}"
    )
    assert jobs.get("keep")["metadata"]["name"] == "keep"


def forbidden(call: Any) -> bool:
    try:
        call()
    except kubernetes.client.ApiException as error:
        return error.status == 403
    return False


@pytest.mark.parametrize("mode", ["namespaced", "all-namespaces"])
def test_the_chart_account_suffices_and_is_least_privilege(
    cluster: Cluster,
    helm: Helm,
    crd: None,
    namespace: str,
    other_namespace: str,
    tmp_path: Path,
    mode: str,
) -> None:
    """The operator, run with a token of the chart's ServiceAccount, takes a job to Succeeded;
    what it must not do is Forbidden."""
    release = release_name()
    fullname = f"{release}-kube-ddp"
    scope = ["--set", f"watchNamespaces={{{other_namespace}}}"] if mode == "namespaced" else []
    # replicaCount=0 is refused by the schema; the chart's pod never runs here anyway (kwok),
    # so the operator under test is a local process with the chart's identity and rights.
    helm.run("install", release, str(CHART), "-n", namespace, *TEST_IMAGE, *scope)
    try:
        kubeconfig = service_account_kubeconfig(
            cluster, namespace, fullname, tmp_path / "sa.kubeconfig"
        )
        watch = [f"--namespace={other_namespace}"] if mode == "namespaced" else ["--all-namespaces"]
        operator = Operator(
            kubeconfig,
            (
                *watch,
                "--leader-election",
                f"--leader-election-namespace={namespace}",
                f"--leader-election-id={fullname}",
            ),
            tmp_path / "operator.log",
        ).start()
        try:
            operator.wait_ready("leader: watching")
            jobs = Jobs(cluster, other_namespace)
            jobs.create(job_manifest("bar", **GPU_2X8))
            jobs.wait_pods("bar", 2)
            jobs.wait_phase("bar", "Running")
            jobs.end_worker("bar-worker-0", 0)
            jobs.wait_phase("bar", "Succeeded")
            # the reporter Role the operator granted (it holds what it grants)
            cluster.rbac.read_namespaced_role("bar-trainer", other_namespace)
            # No RBAC denial (a 403 for a namespace being deleted, in -A mode, is not one).
            assert f'User "system:serviceaccount:{namespace}:{fullname}" cannot' not in (
                operator.log()
            )
        finally:
            operator.stop()
            print("---- operator log ----\n" + operator.log()[-6000:])

        token = service_account_token(cluster, namespace, fullname)
        with cluster.client_with_token(token) as client:
            core: Any = kubernetes.client.CoreV1Api(client)
            assert forbidden(lambda: core.list_namespaced_secret(other_namespace))
            assert forbidden(lambda: core.read_namespaced_secret("any", other_namespace))
            assert forbidden(lambda: core.list_namespaced_secret(namespace))
            assert forbidden(lambda: core.patch_namespaced_pod("bar-worker-0", other_namespace, {}))
            assert forbidden(core.list_namespace)
            assert forbidden(core.list_node)
            if mode == "namespaced":
                pod = {
                    "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                }
                assert forbidden(lambda: core.create_namespaced_pod(namespace, pod))
                assert forbidden(core.list_pod_for_all_namespaces)
                assert not forbidden(lambda: core.list_namespaced_pod(other_namespace))
            else:
                assert not forbidden(core.list_pod_for_all_namespaces)
            coordination: Any = kubernetes.client.CoordinationV1Api(client)
            assert forbidden(lambda: coordination.read_namespaced_lease("other", namespace))
            assert not forbidden(lambda: coordination.read_namespaced_lease(fullname, namespace))
    finally:
        helm.run("uninstall", release, "-n", namespace)


@pytest.mark.parametrize(
    ("values", "flags", "accounts"),
    [
        ([], [], None),
        (
            [
                "--set",
                "operator.podSecurity=restricted",
                "--set",
                "operator.allowedServiceAccounts={etl,train}",
                "--set",
                "operator.fixedNetworkPolicy=true",
            ],
            [
                "--fixed-network-policy",
                "--pod-security=restricted",
                "--allowed-service-account=etl",
                "--allowed-service-account=train",
            ],
            ["etl", "train"],
        ),
        (
            ["--set-json", "operator.allowedServiceAccounts=[]"],
            ["--no-allowed-service-accounts"],
            [],
        ),
    ],
    ids=["unset", "restricted, two accounts", "no account"],
)
def test_the_operators_floor_under_pods_is_a_value(
    helm: Helm, values: list[str], flags: list[str], accounts: list[str] | None
) -> None:
    """operator.podSecurity and operator.allowedServiceAccounts become the flags the operator's
    own parser reads as that policy (None: any account)."""
    (deployment,) = by_kind(helm.template(*values), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    floor = [
        a
        for a in container["args"]
        if a.startswith(("--fixed-network", "--pod-sec", "--allowed", "--no-all"))
    ]
    assert floor == flags
    parsed = cli.build_parser().parse_args(container["args"])
    assert parsed.pod_security == ("restricted" if "restricted" in str(values) else None)
    assert parsed.allowed_service_accounts == accounts
    assert parsed.fixed_network_policy is ("--fixed-network-policy" in flags)


def test_the_operators_own_network_policy_admits_the_scraper_and_the_probes(helm: Helm) -> None:
    """metrics.networkPolicy: the operator's pods take /metrics from the peers listed only, and
    the health port (the kubelet's probes) from anywhere; off by default."""
    assert not by_kind(helm.template(), "NetworkPolicy")
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    objects = helm.template(
        "--set", "metrics.networkPolicy.enabled=true",
        "--set-json", f"metrics.networkPolicy.from=[{json.dumps(monitoring)}]",
    )  # fmt: skip
    (policy,) = by_kind(objects, "NetworkPolicy")
    kubernetes_validate.validate(policy, KUBERNETES_VERSION, strict=True)
    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    named = {port["name"] for port in container["ports"]}
    metrics, health = policy["spec"]["ingress"]
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [monitoring]}
    assert health == {"ports": [{"port": "health", "protocol": "TCP"}]}
    assert {"metrics", "health"} <= named
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
