"""The CLI's console: piped or logged output keeps each message on one line."""

from __future__ import annotations

import subprocess
import sys


def test_a_long_path_printed_to_a_pipe_stays_on_one_line() -> None:
    """`rlkit env pull` printed `unpacked <path>` broken at 80 columns when its output was
    captured, so a script (or a test under a longer temporary folder) could not find the path."""
    path = "/tmp/" + "a-deep-folder/" * 12 + "conf_env-0.1.0"
    code = (
        "from rlkit.progress import make_console\n"
        f"make_console().print('unpacked {path}')\n"
        f"make_console(stderr=True).print('note {path}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == f"unpacked {path}\n"
    assert done.stderr == f"note {path}\n"
