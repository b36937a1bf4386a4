"""A real Kubernetes cluster on 127.0.0.1, built from published Go modules (standard library
only, plus `go` for a cold build and `openssl` for certificates). hack/README.md and
docs/dev-cluster.md describe it.

| module | one job |
| --- | --- |
| paths | where the repository, the binary cache and the cluster's state are |
| build | the pinned Go-module builds |
| pki | certificates and kubeconfig files |
| processes | spawning, recording, stopping and waiting for processes |
| controlplane | etcd, apiserver, controller manager, scheduler, kwok: `up`, `down` |
| pod_remover | the kubelet's last step for kwok's nodes: a deleted pod removed by its uid |
| node | the real node: containerd, CNI, kubelet, CoreDNS; `up`, `down` |
| images | the real node's images, made here |
| host | what the real node changes on the host, recorded and put back |
| packages | each host tool the cluster and the tiers run, and its Debian package |
| mpioperator | the Kubeflow MPI Operator, run against the cluster |
| kueue | Kueue, run out of cluster for the tests of kube-ddp's Kueue contract |
| peers | Kubeflow's Training Operator v1, run against the cluster (`make bench`'s peer) |
| kubeflow_trainer | Kubeflow Trainer v2 and JobSet, run against the cluster (`make bench`'s peer) |
| webhooks | a component's admission webhooks served on 127.0.0.1, registered by URL |
| kind | kind with podman here, and its node image assembled from our builds |
| cli | `hack/dev-cluster.py build|up|down|status|mpi-operator|kueue|kind-*|packages|tool` |

What tests and benchmarks use is re-exported here.
"""

from devcluster import (
    controlplane,
    host,
    images,
    kind,
    kubeflow_trainer,
    kueue,
    mpioperator,
    node,
    packages,
    peers,
)
from devcluster.build import (
    KUBERNETES_VERSION,
    SCHEDULER_PLUGINS_VERSION,
    VOLCANO_VERSION,
    binaries_ready,
    binary,
    build_all,
    built,
    module_dir,
)
from devcluster.controlplane import (
    free_port,
    read_state,
    restart_apiserver,
    running_state,
    up,
)
from devcluster.paths import CACHE_DIR, KUBECONFIG, PKI, STATE_DIR, BuildError, ClusterError


def down() -> bool:
    """Stop this clone's real node (putting the host back), then the control plane; True when
    something was running."""
    had_node = node.down()
    return controlplane.down() or had_node


__all__ = [
    "CACHE_DIR",
    "KUBECONFIG",
    "KUBERNETES_VERSION",
    "PKI",
    "SCHEDULER_PLUGINS_VERSION",
    "STATE_DIR",
    "VOLCANO_VERSION",
    "BuildError",
    "ClusterError",
    "binaries_ready",
    "binary",
    "build_all",
    "built",
    "controlplane",
    "down",
    "free_port",
    "host",
    "images",
    "kind",
    "kubeflow_trainer",
    "kueue",
    "module_dir",
    "mpioperator",
    "node",
    "packages",
    "peers",
    "read_state",
    "restart_apiserver",
    "running_state",
    "up",
]
