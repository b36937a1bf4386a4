"""The `kube-ddp` command line: `crd`, `render` and `operator`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from kube_ddp import clusterview, kueue, podsecurity
from kube_ddp.builders import BuildSettings, trainer_image, trainer_image_variant
from kube_ddp.config import LeaseSettings, OperatorConfig, default_namespace
from kube_ddp.crd import custom_resource_definition
from kube_ddp.jobfile import InputError, read_jobs
from kube_ddp.launchers import build_children
from kube_ddp.local import command as local_command
from kube_ddp.operator_policy import PodPolicy

EXIT_USAGE = 2
EXIT_POD_SECURITY = 1  # render --pod-security: a pod does not meet the level
DEFAULTS = OperatorConfig()
LOG_FORMATS = ("full", "json", "plain")  # kopf.LogFormat's members, lower-cased


class _PlainDumper(yaml.SafeDumper):
    """YAML a user can copy: an object used twice is written out twice, not as `&id001`."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(objects: Sequence[Any]) -> str:
    return yaml.dump_all(objects, Dumper=_PlainDumper, sort_keys=False, default_flow_style=False)


def cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(dump_yaml([custom_resource_definition()]))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    settings = BuildSettings(trainer_image=args.trainer_image, network_policy=args.network_policy)
    jobs = read_jobs(args.file, args.namespace)
    rendered = {
        job.name: build_children(job, attempt=args.attempt, settings=settings) for job in jobs
    }
    refused = False
    for job in jobs:
        if job.spec.image is None:
            what = "its command" if job.spec.command is not None else "the trainer"
            variant = trainer_image_variant(job.spec)
            print(
                f"kube-ddp: {job.name}: {what} runs in {trainer_image(job.spec, settings)}, the "
                f"operator's {variant} trainer image (spec.image unset; the operator's "
                "--trainer-image, the chart's operator.trainerImage)",
                file=sys.stderr,
            )
            if job.spec.accelerator.type in ("gaudi", "amd"):
                print(
                    f"kube-ddp: {job.name}: no release image carries the torch of "
                    f"{job.spec.accelerator.type}: set spec.image to one built on its vendor's "
                    "PyTorch image (docs/install.md, 'Building and loading them')",
                    file=sys.stderr,
                )
        pods = podsecurity.rendered_pods(rendered[job.name])
        if not job.metadata.uid and any(
            kueue.WORKLOAD_ANNOTATION in (pod.metadata.get("annotations") or {}) for pod in pods
        ):
            print(
                f"kube-ddp: {job.name}: the pods' {kueue.WORKLOAD_ANNOTATION} ends with a hash "
                "of the job's uid, which the API server gives it: the name shown is not the one "
                "the cluster's Workload will have",
                file=sys.stderr,
            )
        print(f"kube-ddp: {job.name}: {pod_security_summary(pods)}", file=sys.stderr)
        if args.pod_security is not None:
            for pod in pods:
                found = podsecurity.violations(pod.metadata, pod.spec, args.pod_security)
                if found:
                    refused = True
                    print(
                        f"kube-ddp: {pod.name} violates PodSecurity "
                        f'"{args.pod_security}:latest": ' + ", ".join(map(str, found)),
                        file=sys.stderr,
                    )
    if refused:
        return EXIT_POD_SECURITY
    sys.stdout.write(dump_yaml([obj for objects in rendered.values() for obj in objects]))
    return 0


def pod_security_summary(pods: list[podsecurity.RenderedPod]) -> str:
    """Which Pod Security Standard level a job's pods meet, and what keeps them from the next."""
    met = min(
        (podsecurity.level_met(p.metadata, p.spec) for p in pods),
        key=podsecurity.LEVELS.index,
        default="restricted",
    )
    said = f"its pods meet the {met} Pod Security Standard"
    if met == "restricted":
        return said
    stricter = podsecurity.LEVELS[podsecurity.LEVELS.index(met) + 1]
    reasons = dict.fromkeys(
        str(v) for p in pods for v in podsecurity.violations(p.metadata, p.spec, stricter)
    )
    return f"{said}, not {stricter}: " + ", ".join(reasons)


def _lease_settings(args: argparse.Namespace) -> LeaseSettings | None:
    if not args.leader_election:
        return None
    try:
        return LeaseSettings(
            name=args.leader_election_id,
            namespace=args.leader_election_namespace or default_namespace(),
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    except ValueError as error:
        raise InputError(str(error)) from error


def cmd_operator(args: argparse.Namespace) -> int:
    import asyncio

    import kopf

    from kube_ddp import (
        handlers,  # noqa: F401  (registers the handlers with kopf)
        serving,
    )

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # where kopf's kubeconfig reader looks
    config = OperatorConfig(
        namespaces=tuple(args.namespace or ()),
        trainer_image=args.trainer_image,
        network_policy=args.network_policy,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        log_format=args.log_format,
        workers=args.workers,
        pod_policy=PodPolicy(
            pod_security=args.pod_security,
            service_accounts=None
            if args.allowed_service_accounts is None
            else tuple(args.allowed_service_accounts),
            fixed_network_policy=args.fixed_network_policy,
        ),
    )
    lease = _lease_settings(args)
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[config.log_format.upper()])
    if not args.verbose:
        # kopf logs every successful event handler at INFO: one line per pod change.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    return asyncio.run(serving.run(config, lease, kopf.Memo(config=config)))


def _add_trainer_image(parser: argparse.ArgumentParser) -> None:
    """One setting with one name in every command that builds workers."""
    parser.add_argument(
        "--trainer-image",
        default=DEFAULTS.trainer_image,
        help="the trainer release whose images jobs that name none run: this tag for GPU "
        "jobs, with -cpu for CPU jobs and -mpi for launcher: mpi (default: %(default)s)",
    )


def _add_network_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.network_policy,
        help="give each job a NetworkPolicy admitting only its own pods, unless its "
        "spec.networkPolicy.enabled says otherwise (default: %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kube-ddp", description="Run PyTorch DDP training jobs on Kubernetes."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crd = commands.add_parser("crd", help="print the DDPTrainingJob CustomResourceDefinition")
    crd.set_defaults(run=cmd_crd)

    render = commands.add_parser(
        "render", help="validate a job file and print the objects the operator would create"
    )
    render.add_argument("file", help="a DDPTrainingJob YAML file, or - for stdin")
    render.add_argument("-n", "--namespace", help="namespace (default: the file's, or default)")
    _add_trainer_image(render)
    _add_network_policy(render)
    render.add_argument(
        "--attempt", type=int, default=0, help="the group restart count to render (default 0)"
    )
    render.add_argument(
        "--pod-security",
        choices=podsecurity.LEVELS,
        metavar="LEVEL",
        help="check every pod against this Pod Security Standard level (privileged, baseline, "
        "restricted), as the API server's PodSecurity admission does; exit 1 and no output "
        "when one fails",
    )
    render.set_defaults(run=cmd_render)

    local_command.add_parser(commands)
    clusterview.add_parsers(commands)

    operator = commands.add_parser("operator", help="run the operator")
    scope = operator.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", help="watch this namespace (repeatable)"
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (default)"
    )
    operator.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~)")
    _add_trainer_image(operator)
    _add_network_policy(operator)
    operator.add_argument(
        "--pod-security",
        choices=("baseline", "restricted"),
        help="refuse to create a job's pods that do not meet this Pod Security Standard, "
        "whatever the namespace enforces: the job Fails (PodSecurityViolation), naming each check",
    )
    operator.add_argument(
        "--allowed-service-account",
        dest="allowed_service_accounts",
        action="append",
        metavar="NAME",
        help="the only ServiceAccount a job's template.serviceAccountName may name "
        "(repeatable; default: any). The job's own account is always allowed",
    )
    operator.add_argument(
        "--fixed-network-policy",
        action="store_true",
        help="a job may not turn its NetworkPolicy off or widen it (spec.networkPolicy): the "
        "job Fails (ForbiddenByOperator)",
    )
    operator.add_argument(
        "--no-allowed-service-accounts",
        dest="allowed_service_accounts",
        action="store_const",
        const=[],
        help="no job may name a ServiceAccount of its own",
    )
    operator.add_argument(
        "--health-port",
        type=int,
        default=DEFAULTS.health_port,
        help="/healthz port, 0 for none (%(default)s)",
    )
    operator.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULTS.metrics_port,
        help="/metrics port, 0 for none (%(default)s)",
    )
    operator.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=DEFAULTS.log_format,
        help="json (one object a line), plain, or full (%(default)s)",
    )
    operator.add_argument(
        "--json-logs",
        dest="log_format",
        action="store_const",
        const="json",
        help="the same as --log-format=json",
    )
    election = operator.add_argument_group(
        "leader election", "with several replicas, one leader acts (a coordination.k8s.io Lease)"
    )
    election.add_argument(
        "--leader-election", action="store_true", help="act only while holding the Lease"
    )
    election.add_argument(
        "--leader-election-id", default=LeaseSettings.name, help="the Lease's name (%(default)s)"
    )
    election.add_argument(
        "--leader-election-namespace",
        help="the Lease's namespace (default: $POD_NAMESPACE, the in-cluster one, or default)",
    )
    for flag, field, what in (
        ("--lease-duration", "lease_duration", "a standby waits this long for a silent leader"),
        ("--renew-deadline", "renew_deadline", "a leader that cannot renew this long stops"),
        ("--retry-period", "retry_period", "between renewals and tries"),
    ):
        election.add_argument(
            flag,
            type=float,
            default=LeaseSettings.__dataclass_fields__[field].default,
            help=f"seconds: {what} (%(default)s)",
        )
    operator.add_argument(
        "--workers",
        type=int,
        default=DEFAULTS.workers,
        help="jobs reconciled concurrently (%(default)s)",
    )
    operator.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    operator.set_defaults(run=cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except InputError as error:
        print(error, file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
