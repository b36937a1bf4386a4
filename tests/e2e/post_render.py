"""A Helm post-renderer for the dev platform: the operator container gets an entrypoint and
read-only mounts (argv[1], JSON: command, volumes, volumeMounts). Manifests in on stdin, out
on stdout, as Helm's --post-renderer contract says."""

from __future__ import annotations

import json
import sys

import yaml


def main() -> int:
    patch = json.loads(sys.argv[1])
    documents = [d for d in yaml.safe_load_all(sys.stdin) if d]
    for document in documents:
        if document.get("kind") != "Deployment":
            continue
        pod = document["spec"]["template"]["spec"]
        pod["volumes"] = [*pod.get("volumes", []), *patch["volumes"]]
        for container in pod["containers"]:
            container["command"] = patch["command"]
            container["volumeMounts"] = [*container.get("volumeMounts", []), *patch["volumeMounts"]]
    sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
