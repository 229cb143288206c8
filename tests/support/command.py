"""The ``roomstream`` command run as a user would: a fresh interpreter in a working
directory, without the caller's ``ROOMSTREAM_CONFIG``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(
    *args: str, cwd: Path, columns: int = 200, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m roomstream.cli ARGS`` in ``cwd``, output captured as text.
    ``columns`` fixes the terminal width the output is laid out for."""
    env = {k: v for k, v in os.environ.items() if k != "ROOMSTREAM_CONFIG"}
    env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "roomstream.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
