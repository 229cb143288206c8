"""``POST /search`` on a room that already exists, on any running homeserver.

    python bench/search_room.py --url URL --token TOKEN --room ROOM_ID
                                      [--fill N [--fill-from K]] [--label LABEL] [--name NAME]

The timing is ``bench_client_api.py``'s ``search`` scenario's own
(:func:`bench_client_api.time_searches`: ``rank`` and ``recent``, one untimed call then
``--repeats``, median ms; 10 results, each a message with the term, ``recent`` newest
first). What differs is the set-up: the room is given, not filled here, so a room
filled another way can be measured, for example one filled over several runs.

``--fill N --fill-from K`` first sends, one at a time, messages K to N-1 of the
scenario's N (:func:`bench_client_api.search_texts`, the same texts for every run of one
size), for a room holding the first K (a ``search`` run of size N stopped part-way, whose
sends go out in order). One at a time because Synapse, given 16 sends in flight in one
room, widened the room's DAG (7,354 forward extremities after 41,504 messages here; its
event-creation lock per room did not prevent it) and every later send paid for choosing
prev_events among them, so its rate fell from 46 to 9 events/s; sent one at a time, the
extremities collapsed to one and it kept about 27 events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import aiohttp

import common
from bench_client_api import SEARCH_TERM, Client, User, null_hook, search_texts, time_searches


async def fill(
    client: Client, user: User, room: str, first: int, total: int, hits: int
) -> dict[str, Any]:
    """Send messages ``first`` to ``total - 1`` of the scenario's ``total``, one at a time."""
    texts = search_texts(total, hits)
    print(f"  sending messages {first:,} to {total - 1:,}", flush=True)
    started = time.perf_counter()
    for i in range(first, total):
        # The message's number as the transaction ID: a fill run again from an earlier
        # message does not send one twice (the server answers a repeated ID with the
        # event it made of it).
        body = {"msgtype": "m.text", "body": texts[i]}
        await client.call("PUT", f"/rooms/{room}/send/m.room.message/seq{i}", user.token, body)
        if (i - first + 1) % 5000 == 0:
            rate = (i - first + 1) / (time.perf_counter() - started)
            print(f"  {i + 1:,} ({rate:.1f}/s)", flush=True)
    sent = total - first
    return {
        "search_fill_from": first,
        "search_fill_events_per_s": sent / (time.perf_counter() - started) if sent else None,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = Client(args.url.rstrip("/"), session)
        user = User(
            (await client.call("GET", "/account/whoami", args.token))["user_id"], args.token, ""
        )
        measured: dict[str, Any] = {}
        if args.fill:
            first = args.fill_from
            measured.update(await fill(client, user, args.room, first, args.fill, args.hits))
        load_before = os.getloadavg()
        measured.update(
            await time_searches(
                client,
                user,
                args.room,
                args.repeats,
                null_hook,
                lambda e: SEARCH_TERM in str(e.get("content", {}).get("body", "")).lower(),
            )
        )
        measured["load_before"] = [round(x, 2) for x in load_before]
        measured["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return {"room": args.room, "targets": {args.label: measured}}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True, help="the homeserver's base URL")
    parser.add_argument("--token", required=True, help="an access token of a room member")
    parser.add_argument("--room", required=True, help="the room's ID")
    parser.add_argument(
        "--fill",
        type=int,
        default=0,
        metavar="N",
        help="first complete the room to the scenario's N messages",
    )
    parser.add_argument(
        "--hits", type=int, default=100, help="messages with the term among N (as search_hits)"
    )
    parser.add_argument(
        "--fill-from",
        type=int,
        default=0,
        metavar="K",
        help="with --fill: the room holds messages 0 to K-1 already",
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed searches of each order")
    parser.add_argument("--label", default="server", help="the server's name in the results")
    parser.add_argument(
        "--name", default="search_room", help="results file stem: bench/results/NAME.json"
    )
    args = parser.parse_args()
    results = asyncio.run(run(args))
    for label, measured in results["targets"].items():
        print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in measured.items()))
    print(f"results: {common.write_results(args.name, results, False)}")


if __name__ == "__main__":
    main()
