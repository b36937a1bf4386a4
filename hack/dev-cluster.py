#!/usr/bin/env python3
"""A real Kubernetes cluster on 127.0.0.1, built from published Go modules (hack/devcluster/).

dev-cluster.py build    build the pinned binaries into the cache (no-op when warm)
dev-cluster.py up       build if needed, start the control plane and the fake nodes
dev-cluster.py down     stop exactly the processes `up` started
dev-cluster.py status   say what runs
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from devcluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
