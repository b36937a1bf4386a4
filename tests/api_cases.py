"""Invalid job specs and what each must be refused with: one table for two tiers.

The unit tier checks that the API models (what `kube-ddp render` uses) refuse each spec with a
line naming the field and the fix; the cluster tier sends the same specs to the real API server
(server-side dry run) and checks that it refuses them too, with the same words for every
cross-field rule. A CEL typo cannot hide behind a correct Python check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kube_ddp import names


@dataclass(frozen=True)
class Rejection:
    id: str
    spec: dict[str, Any]
    problem: str  # how render's line starts: the field path, then what is wrong
    # What the API server's message contains; None: the same words as render's (the message of
    # a cross-field rule, after the field path), which the server must then say too.
    server: str | None = None
    rule: bool = False  # a cross-field Rule (CEL on the server, Python locally)

    @property
    def server_says(self) -> str:
        return self.server if self.server is not None else self.problem.split(": ", 1)[1]


REJECTIONS = [
    Rejection(
        "no nodes", {}, "spec.nodes: required field is missing", "spec.nodes: Required value"
    ),
    Rejection(
        "zero nodes",
        {"nodes": 0},
        "spec.nodes: Input should be greater than or equal to 1",
        "should be greater than or equal to 1",
    ),
    Rejection(
        "nodes a string",
        {"nodes": "two"},
        "spec.nodes: Input should be a valid integer",
        "must be of type integer",
    ),
    Rejection(
        "unknown accelerator",
        {"nodes": 1, "accelerator": {"type": "tpu", "perNode": 4}},
        "spec.accelerator.type: Input should be 'nvidia', 'gaudi', 'amd' or 'cpu' (got 'tpu')",
        'Unsupported value: "tpu"',
    ),
    Rejection(
        "gpu without perNode",
        {"nodes": 1, "accelerator": {"type": "nvidia"}},
        "spec.accelerator: perNode is required for accelerator type nvidia: set "
        "accelerator.perNode to the devices each worker pod gets",
        rule=True,
    ),
    Rejection(
        "unknown field",
        {"nodes": 1, "replicas": 2},
        "spec.replicas: unknown field: check its spelling (keys are camelCase)",
        'unknown field "spec.replicas"',
    ),
    Rejection(
        "snake_case key",
        {"nodes": 1, "run_policy": {}},
        "spec.run_policy: unknown field",
        'unknown field "spec.run_policy"',
    ),
    Rejection(
        "nested unknown field",
        {"nodes": 1, "runPolicy": {"backofLimit": 2}},
        "spec.runPolicy.backofLimit: unknown field",
        'unknown field "spec.runPolicy.backofLimit"',
    ),
    Rejection(
        "negative backoffLimit",
        {"nodes": 1, "runPolicy": {"backoffLimit": -1}},
        "spec.runPolicy.backoffLimit: Input should be greater than or equal to 0",
        "should be greater than or equal to 0",
    ),
    Rejection(
        "unknown cleanPodPolicy",
        {"nodes": 1, "runPolicy": {"cleanPodPolicy": "Some"}},
        "spec.runPolicy.cleanPodPolicy: Input should be 'Running', 'All' or 'None'",
        'Unsupported value: "Some"',
    ),
    Rejection(
        "retryable exit code out of range",
        {"nodes": 1, "runPolicy": {"retryableExitCodes": [1, 300]}},
        "spec.runPolicy.retryableExitCodes[1]: Input should be less than or equal to 255",
        "should be less than or equal to 255",
    ),
    Rejection(
        "no port left for the last attempt",
        {"nodes": 1, "port": 65534, "runPolicy": {"backoffLimit": 2}},
        "spec: port + runPolicy.backoffLimit must be at most 65535: each group restart "
        "rendezvous on the next port; lower port or backoffLimit",
        rule=True,
    ),
    Rejection(
        "reserved env",
        {"nodes": 1, "env": [{"name": "HOME", "value": "/x"}, {"name": "WORLD_SIZE"}]},
        "spec.env[1]: WORLD_SIZE is reserved: kube-ddp sets it on every worker (the env "
        "contract); remove it from spec.env",
        rule=True,
    ),
    Rejection(
        "duplicate env",
        {"nodes": 1, "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "spec.env: duplicate env names: A",
        "Duplicate value",
    ),
    Rejection(
        "env value and valueFrom",
        {"nodes": 1, "env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]},
        "spec.env[0]: set value or valueFrom, not both",
        rule=True,
    ),
    Rejection(
        "elastic min above max",
        {"nodes": 2, "elastic": {"minNodes": 3, "maxNodes": 2}},
        "spec.elastic: minNodes must not exceed maxNodes",
        rule=True,
    ),
    Rejection(
        "nodes outside elastic range",
        {"nodes": 5, "elastic": {"minNodes": 1, "maxNodes": 4}},
        "spec: nodes must lie within elastic.minNodes..elastic.maxNodes",
        rule=True,
    ),
    Rejection(
        "elastic with mpi",
        {"nodes": 2, "launcher": "mpi", "elastic": {"minNodes": 1, "maxNodes": 2}},
        "spec: elastic is not supported with launcher mpi: use launcher torchrun or remove elastic",
        rule=True,
    ),
    Rejection(
        "checkpointDir an S3 URI without a valid bucket",
        {"nodes": 1, "trainer": {"checkpointDir": "s3://My_Bucket/run"}},
        "spec: trainer.checkpointDir must be s3://BUCKET or s3://BUCKET/PREFIX, the bucket "
        "3-63 lowercase letters, digits, dots and hyphens",
        rule=True,
    ),
    Rejection(
        "checkpointStore without an S3 checkpointDir",
        {
            "nodes": 1,
            "trainer": {"checkpointDir": "/ckpt"},
            "checkpointStore": {"secretName": "s3-credentials"},
        },
        "spec: checkpointStore holds the credentials of an object store: set "
        "trainer.checkpointDir to s3://BUCKET/PREFIX, or remove checkpointStore",
        rule=True,
    ),
    Rejection(
        "checkpointStore with mpi",
        {
            "nodes": 1,
            "launcher": "mpi",
            "trainer": {"checkpointDir": "s3://bucket/run"},
            "checkpointStore": {"secretName": "s3-credentials"},
        },
        "spec: checkpointStore is not supported with launcher mpi yet: give the workers the "
        "AWS_* variables in env (valueFrom.secretKeyRef) instead",
        rule=True,
    ),
    Rejection(
        "checkpointStore secret not an object name",
        {
            "nodes": 1,
            "trainer": {"checkpointDir": "s3://bucket/run"},
            "checkpointStore": {"secretName": "S3 Credentials"},
        },
        "spec.checkpointStore.secretName: String should match pattern",
        "spec.checkpointStore.secretName: Invalid value",
    ),
    *(
        Rejection(
            f"{field} a path",
            {"nodes": 1, "template": {field: "../../api/v1/namespaces/kube-system/secrets"}},
            f"spec.template.{field}: String should match pattern",
            f"spec.template.{field}: Invalid value",
        )
        for field in (
            "priorityClassName",
            "schedulerName",
            "serviceAccountName",
            "runtimeClassName",
        )
    ),
    Rejection(
        "image reference too long",
        {"nodes": 1, "image": "registry.example/" + "a" * 1024},
        "spec.image: String should have at most 1024 characters",
        "spec.image: Too long",
    ),
    Rejection(
        "too many epochs",
        {"nodes": 1, "trainer": {"epochs": 1_000_001}},
        "spec.trainer.epochs: Input should be less than or equal to 1000000",
        "should be less than or equal to 1000000",
    ),
    Rejection(
        "too many arguments",
        {"nodes": 1, "command": ["python"], "args": ["-v"] * 4097},
        "spec.args: List should have at most 4096 items",
        "spec.args: Too many",
    ),
    Rejection(
        "label value too long",
        {"nodes": 1, "template": {"labels": {"team": "a" * 64}}},
        "spec.template.labels.team: String should have at most 63 characters",
        "spec.template.labels.team: Too long",
    ),
    Rejection(
        "grace period past ten years",
        {"nodes": 1, "template": {"terminationGracePeriodSeconds": 315_360_001}},
        "spec.template.terminationGracePeriodSeconds: Input should be less than or equal to "
        "315360000",
        "should be less than or equal to 315360000",
    ),
    Rejection(
        "gang larger than the job",
        {"nodes": 2, "scheduling": {"gang": {"minMember": 3}}},
        "spec: scheduling.gang.minMember must not exceed nodes",
        rule=True,
    ),
    Rejection(
        "kubernetes gang with mpi",
        {"nodes": 2, "launcher": "mpi", "scheduling": {"gang": {"scheduler": "kubernetes"}}},
        "spec: scheduling.gang with launcher mpi needs scheduler coscheduling or volcano: the "
        "MPI Operator drops spec.schedulingGroup, by which a pod joins a kubernetes PodGroup, "
        "from the pods it creates",
        rule=True,
    ),
    Rejection(
        "gang timeout for another scheduler",
        {"nodes": 2, "scheduling": {"gang": {"scheduleTimeoutSeconds": 60}}},
        "spec.scheduling.gang: scheduleTimeoutSeconds is read only by scheduler coscheduling: "
        "name it",
        rule=True,
    ),
    Rejection(
        "volcano queue for another scheduler",
        {"nodes": 2, "scheduling": {"gang": {"scheduler": "coscheduling", "queue": "q"}}},
        "spec.scheduling.gang: queue is read only by scheduler volcano: name it (a Kueue queue "
        "is the label kueue.x-k8s.io/queue-name)",
        rule=True,
    ),
    Rejection(
        "network policy ingress while turned off",
        {"nodes": 2, "networkPolicy": {"enabled": False, "ingress": [{"from": []}]}},
        "spec.networkPolicy: ingress widens the job's NetworkPolicy, which enabled: false "
        "turns off: remove one of them",
        rule=True,
    ),
    Rejection(
        "topology level not a label key",
        {"nodes": 2, "scheduling": {"topology": {"level": "rack name"}}},
        "spec.scheduling.topology.level: String should match pattern",
        "spec.scheduling.topology.level: Invalid value",
    ),
    Rejection(
        "unknown topology mode",
        {"nodes": 2, "scheduling": {"topology": {"level": "rack", "mode": "Strict"}}},
        "spec.scheduling.topology.mode: Input should be 'Required' or 'Preferred' (got 'Strict')",
        'Unsupported value: "Strict"',
    ),
    Rejection(
        "unknown gang scheduler",
        {"nodes": 2, "scheduling": {"gang": {"scheduler": "yunikorn"}}},
        "spec.scheduling.gang.scheduler: Input should be 'kubernetes', 'coscheduling' or "
        "'volcano' (got 'yunikorn')",
        'Unsupported value: "yunikorn"',
    ),
    Rejection(
        "mpi settings with torchrun",
        {"nodes": 2, "mpi": {"socketsPerNode": 2}},
        "spec: mpi settings are only read with launcher mpi: set launcher: mpi or remove mpi",
        rule=True,
    ),
    Rejection(
        "args without command",
        {"nodes": 1, "args": ["x"]},
        "spec: args needs command: set command to your program, or use trainer for the "
        "built-in entrypoint",
        rule=True,
    ),
    Rejection(
        "command and trainer",
        {"nodes": 1, "command": ["python", "x.py"], "trainer": {"epochs": 1}},
        "spec: set either command (your own program) or trainer (the built-in entrypoint's "
        "options), not both",
        rule=True,
    ),
    Rejection(
        "more processes than accelerators",
        {"nodes": 1, "accelerator": {"type": "nvidia", "perNode": 4}, "nprocPerNode": 8},
        "spec: nprocPerNode must not exceed accelerator.perNode: one process per accelerator",
        rule=True,
    ),
    Rejection(
        "hccl on nvidia",
        {"nodes": 1, "accelerator": {"type": "nvidia", "perNode": 4}, "backend": "hccl"},
        "spec: backend hccl does not run on accelerator nvidia: use backend auto",
        rule=True,
    ),
    Rejection(
        "nccl on cpu",
        {"nodes": 1, "backend": "nccl"},
        "spec: backend nccl does not run on accelerator cpu: use backend auto",
        rule=True,
    ),
    Rejection(
        "owned label in template",
        {"nodes": 1, "template": {"labels": {names.LABEL_ATTEMPT: "9"}}},
        "spec.template: labels " + ", ".join(names.OWNED_LABELS) + " are set by the "
        "operator; choose other label keys",
        rule=True,
    ),
    Rejection(
        "misspelled template key",
        {"nodes": 1, "template": {"nodeSelectr": {"pool": "a"}}},
        "spec.template.nodeSelectr: unknown field",
        'unknown field "spec.template.nodeSelectr"',
    ),
    Rejection(
        "a pod field kube-ddp does not take",
        {"nodes": 1, "template": {"hostNetwork": True}},
        "spec.template.hostNetwork: not supported: the workers reach each other",
        "hostNetwork is not supported: the workers reach each other",
    ),
    Rejection(
        "containers beside the worker's",
        {"nodes": 1, "template": {"containers": [{"name": "proxy", "image": "envoy"}]}},
        "spec.template.containers: not supported: the worker container is kube-ddp's: set its "
        "settings in template.container; a sidecar is an initContainer with restartPolicy: "
        "Always",
        "containers is not supported: the worker container is kube-ddp's",
    ),
    Rejection(
        "a container field kube-ddp sets itself",
        {"nodes": 1, "template": {"container": {"image": "me/train:1"}}},
        "spec.template.container.image: not supported: use spec.image",
        "image is not supported: use spec.image",
    ),
    Rejection(
        "a container setting at the pod's level",
        {"nodes": 1, "template": {"envFrom": [{"secretRef": {"name": "s"}}]}},
        "spec.template.envFrom: a container's setting: write it as template.container.envFrom",
        'unknown field "spec.template.envFrom"',
    ),
    Rejection(
        "accelerator device in resources.limits",
        {"nodes": 1, "resources": {"limits": {"nvidia.com/gpu": 2}}},
        "spec.resources: accelerator devices in resources.limits are set by the operator: use "
        "accelerator.type and accelerator.perNode instead",
        rule=True,
    ),
    Rejection(
        "accelerator device in resources.requests",
        {"nodes": 1, "resources": {"requests": {"habana.ai/gaudi": 1}}},
        "spec.resources: accelerator devices in resources.requests are set by the operator: "
        "use accelerator.type and accelerator.perNode instead",
        rule=True,
    ),
    Rejection(
        "bad quantity",
        {"nodes": 1, "resources": {"requests": {"memory": "lots"}}},
        "spec.resources.requests.memory",
        "spec.resources.requests.memory",
    ),
    Rejection(
        "trainer option unknown",
        {"nodes": 1, "trainer": {"epoch": 3}},
        "spec.trainer.epoch: unknown field",
        'unknown field "spec.trainer.epoch"',
    ),
    Rejection(
        "trainer option invalid",
        {"nodes": 1, "trainer": {"targetAccuracy": 1.5}},
        "spec.trainer.targetAccuracy: Input should be less than or equal to 1",
        "should be less than or equal to 1",
    ),
    Rejection(
        "trainer dataset unknown",
        {"nodes": 1, "trainer": {"dataset": "imagenet"}},
        "spec.trainer.dataset: Input should be 'mnist', 'fashion-mnist'",
        'Unsupported value: "imagenet"',
    ),
    # JSON types, typed as the server types them: nothing is converted, null is unset.
    Rejection(
        "quoted number",
        {"nodes": "2"},
        "spec.nodes: Input should be a valid integer (got the string '2': write it without quotes)",
        "spec.nodes in body must be of type integer",
    ),
    Rejection(
        "boolean for a number",
        {"nodes": True},
        "spec.nodes: Input should be a valid integer (got the boolean true)",
        "spec.nodes in body must be of type integer",
    ),
    Rejection(
        "fraction for an integer",
        {"nodes": 2.5},
        "spec.nodes: Input should be a valid integer (got the number 2.5)",
        "spec.nodes in body must be of type integer",
    ),
    Rejection(
        "null for a required field",
        {"nodes": None},
        "spec.nodes: required field is missing",
        "spec.nodes: Required value",
    ),
    Rejection(
        "number for a string",
        {"nodes": 1, "image": 3},
        "spec.image: Input should be a valid string (got the number 3: quote it)",
        "spec.image in body must be of type string",
    ),
    Rejection(
        "quoted boolean",
        {"nodes": 1, "runPolicy": {"suspend": "true"}},
        "spec.runPolicy.suspend: Input should be a valid boolean (got the string 'true'",
        "spec.runPolicy.suspend in body must be of type boolean",
    ),
    Rejection(
        "quoted trainer option",
        {"nodes": 1, "trainer": {"epochs": "3"}},
        "spec.trainer.epochs: Input should be a valid integer (got the string '3'",
        "spec.trainer.epochs in body must be of type integer",
    ),
    Rejection(
        "null list item",
        {"nodes": 1, "env": [None]},
        "spec.env[0]: Input should be a valid dictionary or instance of EnvVar (got null)",
        "spec.env[0] in body must be of type object",
    ),
    Rejection(
        "fractional quantity",
        {"nodes": 1, "resources": {"limits": {"cpu": 0.5}}},
        "spec.resources.limits.cpu",
        "spec.resources.limits.cpu in body must be of type integer,string",
    ),
]
