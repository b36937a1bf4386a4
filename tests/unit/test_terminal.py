"""Text pods wrote, printed with its control characters dropped (kube_ddp/terminal.py): the
local console's worker lines and notes here; describe and logs print through the same two."""

from __future__ import annotations

import io

from kube_ddp.local.console import Console
from kube_ddp.local.plan import WorkerLaunch
from kube_ddp.terminal import printable, printable_line

# An OSC that retitles the window, a CSI that clears the screen, a C1 CSI, a bell, a NUL.
HOSTILE = "loss 0.5\x1b]0;owned\x07\x1b[2J\x9b1m\x00 done\tok"


def test_control_characters_are_dropped_and_tabs_kept() -> None:
    assert printable(HOSTILE) == "loss 0.5]0;owned[2J1m done\tok"
    assert printable("two\nlines\r\n") == "two\nlines\n"
    assert printable_line("two\nlines") == "two lines"
    assert printable("naïve ünïcode ✓ 日本") == "naïve ünïcode ✓ 日本"


def test_the_local_console_prints_a_workers_line_without_them() -> None:
    out, err = io.StringIO(), io.StringIO()
    console = Console(out, err, logs_dir=None)
    launch = WorkerLaunch(pod="bar-worker-0", index=0, attempt=0, argv=[], env={}, pod_env={})
    console.worker_line(launch, HOSTILE)
    console.note(f"Warning WorkerFailed: {HOSTILE}")
    assert out.getvalue() == "[worker-0] loss 0.5]0;owned[2J1m done\tok\n"
    assert "\x1b" not in err.getvalue() and "\x07" not in err.getvalue()
