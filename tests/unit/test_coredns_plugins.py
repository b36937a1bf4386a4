"""CoreDNS built with only the plugins its Corefiles use (hack/devcluster/build.py): its main
links them in plugin.cfg's order, and every Corefile we start it with names only those. The
binary itself runs under the real node (tests/e2e, pods resolving Services) and in kind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cluster.support import load_dev_cluster

build = load_dev_cluster().build
node = load_dev_cluster().node

MODULE = "github.com/coredns/coredns"
PLUGIN_CFG = """# a comment
root:root
metadata:metadata
cache:cache
prometheus:metrics
kubernetes:kubernetes
on:github.com/coredns/caddy/onevent
forward:forward
"""


def test_the_main_links_the_chosen_plugins_in_plugin_cfg_order() -> None:
    chosen = build.chosen_plugins(MODULE, PLUGIN_CFG, ("forward", "on", "prometheus", "cache"))
    main = build.plugins_main(MODULE, chosen)
    imports = re.findall(r'_ "([^"]+)"', main)
    assert imports == [
        f"{MODULE}/plugin/cache",
        f"{MODULE}/plugin/metrics",  # the package, not the directive's name
        "github.com/coredns/caddy/onevent",  # a path of its own is kept
        f"{MODULE}/plugin/forward",
    ]
    assert re.findall(r'^\t\t"(\w+)",$', main, re.M) == ["cache", "prometheus", "on", "forward"]
    assert "dnsserver.Directives = []string{" in main and "coremain.Run()" in main


def test_a_plugin_plugin_cfg_lacks_is_a_build_error() -> None:
    with pytest.raises(build.BuildError, match="lists no log"):
        build.chosen_plugins(MODULE, PLUGIN_CFG, ("cache", "log"))


def test_the_real_nodes_corefile_uses_only_plugins_the_build_links(tmp_path: Path) -> None:
    corefile = node.corefile(tmp_path / "kubeconfig")
    # A directive opens a line of the server block; a plugin's own options sit in its braces.
    depth, directives = 0, set()
    for line in corefile.splitlines():
        words = line.split()
        if depth == 1 and words and words[0] != "}":
            directives.add(words[0])
        depth += line.count("{") - line.count("}")
    assert directives == {"bind", "errors", "kubernetes", "forward", "cache"}
    assert directives <= set(build.COREDNS_PLUGINS)
