"""Replication codec throughput: roomstream vs Synapse's own parser, in the same run.

Measures lines/s for parse (bytes off the wire -> fully decoded command) and serialize
(command -> bytes to write) on realistic lines: an events-stream RDATA, a caches RDATA
and a POSITION. Synapse side: ``parse_command_from_line(line.decode())`` (what its
protocol does with each received line) and ``(NAME + " " + cmd.to_line()).encode()``
(what it writes). Both sides are timed interleaved, in short rounds, keeping each one's
best round, so load from other processes hits both alike.

Writes bench/results/codec.json. Needs the ``bench`` extra (matrix-synapse).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roomstream.replication.commands import parse_line, serialize
from roomstream.replication.connection import ReplicationConnection

try:
    from synapse.replication.tcp.commands import parse_command_from_line
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit(
        "bench_codec needs Synapse to compare against: "
        "cd /work/main && .venv/bin/pip install -e '.[bench]'"
    )

RESULTS = Path(__file__).parent / "results" / "codec.json"

CASES: dict[str, bytes] = {
    "rdata_events": (
        b'RDATA events master 1843271 ["ev",["$Hk3Lq0zv2bO9xGmYfNt4RcWpQeJ8sAuDiVl1nT6yZxo",'
        b'"!aBcDeFgHiJkLmNoPqR:matrix.example.org","m.room.message",null,null,null,null,'
        b"false,false]]"
    ),
    "rdata_events_member": (
        b'RDATA events event_persister1 1843272 ["ev",["$pW3nq7Ryb1s0VhKZoTcE8gUa2LdXfMiJ'
        b'4kYtN6Ob9xQ","!aBcDeFgHiJkLmNoPqR:matrix.example.org","m.room.member",'
        b'"@alice:matrix.example.org",null,null,"join",false,false]]'
    ),
    "rdata_caches": (
        b'RDATA caches master 550953771 ["get_user_by_id",["@bob:matrix.example.org"],'
        b"1550574873251]"
    ),
    "rdata_caches_batch": (
        b'RDATA caches master batch ["cs_cache_fake",["!aBcDeFgHiJkLmNoPqR:matrix.example.org",'
        b'"m.room.member","@carol:matrix.example.org"],1550574873252]'
    ),
    "position": b"POSITION events master 1843271 1843275",
}

ROUND_LINES = 2000
ROUNDS = 60


def best_rate(
    funcs: dict[str, Callable[[Any], object]], items: dict[str, list[Any]]
) -> dict[str, float]:
    """Lines/s of each function's best round, rounds interleaved between functions."""
    best = dict.fromkeys(funcs, float("inf"))
    for _ in range(ROUNDS):
        for name, func in funcs.items():
            batch = items[name]
            start = time.perf_counter()
            for item in batch:
                func(item)
            elapsed = time.perf_counter() - start
            best[name] = min(best[name], elapsed)
    return {name: ROUND_LINES / t for name, t in best.items()}


def synapse_serialize(cmd: Any) -> bytes:
    return f"{cmd.NAME} {cmd.to_line()}".encode()


def synapse_parse(line: bytes) -> object:
    return parse_command_from_line(line.decode("utf-8"))


def check_equivalent(line: bytes) -> None:
    """Both parsers must decode the line to the same fields (no faked parse)."""
    ours = parse_line(line)
    theirs = synapse_parse(line)
    assert ours.NAME == theirs.NAME  # type: ignore[attr-defined]
    ours_fields = list(ours)
    theirs_fields = [getattr(theirs, slot) for slot in type(theirs).__slots__]  # type: ignore[attr-defined]
    assert ours_fields == theirs_fields, (ours_fields, theirs_fields)
    assert serialize(ours) == synapse_serialize(theirs) + b"\n"


def stream_case() -> dict[str, float]:
    """Whole-stream receive: framing + parse of a 2000-line burst in 64 KiB chunks."""
    lines = [CASES[name] for name in ("rdata_events", "rdata_caches", "position")] * (
        ROUND_LINES // 3
    )
    blob = b"\n".join(lines) + b"\n"
    chunks = [blob[i : i + 65536] for i in range(0, len(blob), 65536)]

    def ours(_: object) -> None:
        conn = ReplicationConnection.client("w", None)
        conn.start(0.0)
        for chunk in chunks:
            conn.receive_data(chunk, 0.0)

    def theirs(_: object) -> None:
        # Synapse's LineOnlyReceiver framing, then its per-line handling.
        buffer = b""
        for chunk in chunks:
            parts = (buffer + chunk).split(b"\n")
            buffer = parts.pop()
            for line in parts:
                if line.strip() == b"":
                    continue
                parse_command_from_line(line.decode("utf-8"))

    best = {"roomstream": float("inf"), "synapse": float("inf")}
    for _ in range(ROUNDS // 3):
        for name, func in (("roomstream", ours), ("synapse", theirs)):
            start = time.perf_counter()
            func(None)
            best[name] = min(best[name], time.perf_counter() - start)
    n = len(lines)
    return {name: n / t for name, t in best.items()}


def main() -> None:
    results: dict[str, Any] = {}
    for case, line in CASES.items():
        check_equivalent(line)
        ours_cmd = parse_line(line)
        theirs_cmd = synapse_parse(line)
        lines = [line] * ROUND_LINES
        parse = best_rate(
            {"roomstream": parse_line, "synapse": synapse_parse},
            {"roomstream": lines, "synapse": lines},
        )
        ser = best_rate(
            {"roomstream": serialize, "synapse": synapse_serialize},
            {"roomstream": [ours_cmd] * ROUND_LINES, "synapse": [theirs_cmd] * ROUND_LINES},
        )
        results[case] = {
            "line_bytes": len(line),
            "parse_lines_per_s": {k: round(v) for k, v in parse.items()},
            "parse_ratio_vs_synapse": round(parse["roomstream"] / parse["synapse"], 2),
            "serialize_lines_per_s": {k: round(v) for k, v in ser.items()},
            "serialize_ratio_vs_synapse": round(ser["roomstream"] / ser["synapse"], 2),
        }
        print(
            f"{case:22s} parse {parse['roomstream']:>10,.0f}/s vs {parse['synapse']:>10,.0f}/s "
            f"({results[case]['parse_ratio_vs_synapse']:.2f}x)   serialize "
            f"{ser['roomstream']:>10,.0f}/s vs {ser['synapse']:>10,.0f}/s "
            f"({results[case]['serialize_ratio_vs_synapse']:.2f}x)"
        )
    stream = stream_case()
    results["stream_receive_mixed"] = {
        "parse_lines_per_s": {k: round(v) for k, v in stream.items()},
        "parse_ratio_vs_synapse": round(stream["roomstream"] / stream["synapse"], 2),
    }
    ratio = results["stream_receive_mixed"]["parse_ratio_vs_synapse"]
    print(
        f"{'stream_receive_mixed':22s} parse {stream['roomstream']:>10,.0f}/s vs "
        f"{stream['synapse']:>10,.0f}/s ({ratio:.2f}x)"
    )

    from importlib.metadata import version

    out = {
        "benchmark": "replication codec: roomstream vs synapse.replication.tcp.commands",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "python_version": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "loadavg_at_end": list(os.getloadavg()),
        },
        "versions": {"matrix-synapse": version("matrix-synapse"), "orjson": version("orjson")},
        "method": (
            f"best of {ROUNDS} interleaved rounds of {ROUND_LINES} lines per side; parse = "
            "bytes line -> decoded command (Synapse: line.decode() + parse_command_from_line);"
            " serialize = command -> bytes line (Synapse: NAME + ' ' + to_line(), encoded)"
        ),
        "cases": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
