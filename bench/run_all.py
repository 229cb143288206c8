"""Run every ``bench/bench_*.py`` script, one subprocess each, with this interpreter.

Usage::

    python bench/run_all.py [--quick] [--only NAME ...]

``NAME`` is a script's name with or without the ``bench_`` prefix and ``.py`` suffix
(``streams``, ``bench_streams``). A failing script does not stop the others; the exit
status is non-zero if any failed. Results land in ``bench/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def discover() -> list[Path]:
    return sorted(BENCH_DIR.glob("bench_*.py"))


def short_name(script: Path) -> str:
    return script.stem.removeprefix("bench_")


def select(scripts: list[Path], only: list[str] | None) -> list[Path]:
    if not only:
        return scripts
    wanted = {name.removesuffix(".py").removeprefix("bench_") for name in only}
    chosen = [s for s in scripts if short_name(s) in wanted]
    unknown = wanted - {short_name(s) for s in chosen}
    if unknown:
        known = ", ".join(short_name(s) for s in scripts) or "none"
        raise SystemExit(f"unknown benchmark(s): {', '.join(sorted(unknown))} (known: {known})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke test")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="run only this benchmark (repeatable)"
    )
    args = parser.parse_args(argv)

    scripts = select(discover(), args.only)
    if not scripts:
        print("no bench/bench_*.py scripts found", file=sys.stderr)
        return 1
    outcomes: list[tuple[str, int, float]] = []
    for script in scripts:
        command = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        print(f"=== {short_name(script)}: {' '.join(command)}", flush=True)
        started = time.perf_counter()
        try:
            code = subprocess.run(command, cwd=BENCH_DIR.parent, check=False).returncode
        except OSError as exc:
            print(f"could not start {script}: {exc}", file=sys.stderr)
            code = 127
        outcomes.append((short_name(script), code, time.perf_counter() - started))

    print("\n=== summary")
    for name, code, seconds in outcomes:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"{name:<24} {status:<20} {seconds:8.1f} s")
    failed = [name for name, code, _ in outcomes if code != 0]
    if failed:
        print(f"{len(failed)} benchmark(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
