"""Every client endpoint, driven with random bodies, path values, query parameters and
tokens (valid and not): the answer is always a Matrix JSON error or success, never a 5xx.

The server runs on its own thread and event loop so that hypothesis drives it with plain
blocking HTTP requests.
"""

from __future__ import annotations

import http.client
import re
from urllib.parse import quote, urlencode

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import FuzzTarget, json_values

VALUES = [target_values := None]  # placeholder replaced below
KEYS = [
    "type",
    "user",
    "identifier",
    "password",
    "username",
    "auth",
    "room_id",
    "user_id",
    "name",
    "topic",
    "invite",
    "preset",
    "room_version",
    "initial_state",
    "visibility",
    "power_level_content_override",
    "room_alias_name",
    "typing",
    "timeout",
    "messages",
    "reason",
    "body",
    "msgtype",
    "m.fully_read",
    "m.read",
    "order",
    "device_id",
    "inhibit_login",
    "is_direct",
    "room",
    "thread_id",
    "new_version",
    "score",
]
bodies = st.one_of(
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6),
    json_values,
    st.binary(max_size=40),
    # Deep nesting: refused at parse time (more than 255 levels cannot be re-encoded).
    st.integers(1, 1100).map(lambda d: b'{"type":' + b"[" * d + b"]" * d + b"}"),
)
QUERY = [
    "since",
    "timeout",
    "limit",
    "from",
    "to",
    "dir",
    "filter",
    "at",
    "membership",
    "not_membership",
    "username",
    "kind",
    "full_state",
    "set_presence",
    "access_token",
    "archived",
    "room_id",
    "ts",
    "max_depth",
    "suggested_only",
]
query_values = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "0",
            "-1",
            "10",
            "b",
            "f",
            "true",
            "{}",
            "s1",
            "t1-1",
            "s0_0_0_0_0",
            "99999999999999999999",
        ]
    ),
)
queries = st.dictionaries(st.sampled_from(QUERY), query_values, max_size=4).map(
    # A valid long-poll would wait: the fuzz keeps sync timeouts at zero or invalid.
    lambda q: {
        k: ("0" if k == "timeout" and re.fullmatch(r"[0-9]+", v) else v) for k, v in q.items()
    }
)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_endpoint_answers_5xx(target: FuzzTarget, data: st.DataObject) -> None:
    method, template = data.draw(st.sampled_from(target.routes), label="route")
    method = data.draw(st.sampled_from([method] * 6 + ["GET", "POST", "PUT", "DELETE"]))

    def fill(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[0]
        known = {
            "room_id": target.room_id,
            "user_id": target.user_id,
            "event_id": target.event_id,
            "room": target.room_id,
        }.get(name)
        choices = [st.text(max_size=30)]
        if known is not None:
            choices = [st.just(known)] * 4 + choices
        if name == "api_version":
            return "v3"
        return quote(data.draw(st.one_of(*choices), label=name), safe="")

    path = re.sub(r"\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", fill, template)
    query = data.draw(queries, label="query")
    if template.endswith("/events"):
        # The old event stream long-polls 30 s by default: keep the fuzz from waiting.
        query["timeout"] = "0"
    if query:
        path += "?" + urlencode(query)
    tokens = [target.token] * 6 + [None, "rst_bogus", "\u00e9"]
    token = data.draw(st.sampled_from(tokens), label="token")
    body = data.draw(bodies, label="body")
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    try:
        conn.request(
            method,
            path,
            body=raw if method in ("POST", "PUT") else None,
            headers={k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()},
        )
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    event(f"{resp.status}")
    assert resp.status < 500, (method, path, resp.status, payload[:300])
    decoded = orjson.loads(payload)
    if resp.status >= 400:
        assert isinstance(decoded, dict), decoded
        if resp.status == 401 and "flows" in decoded:
            return  # user-interactive auth: the flows, no errcode (spec)
        assert decoded["errcode"].startswith("M_"), decoded
