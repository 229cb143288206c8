"""The end-to-end-encryption endpoints driven with random, roughly shaped bodies (the
fields they read, user IDs, key names, key-backup session objects): the answer is always
a Matrix JSON error or success, never a 5xx. Uses the server of tests/support/fuzz.py."""

from __future__ import annotations

import http.client
from typing import Any
from urllib.parse import quote

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import FuzzTarget, json_values

FIELDS = [
    "device_keys", "one_time_keys", "fallback_keys", "user_id", "device_id", "algorithms",
    "keys", "signatures", "usage", "master_key", "self_signing_key", "user_signing_key",
    "auth", "rooms", "sessions", "first_message_index", "forwarded_count", "is_verified",
    "session_data", "algorithm", "auth_data", "version", "devices", "display_name", "type",
    "password", "identifier", "timeout",
]  # fmt: skip
NAMES = st.sampled_from(["@fuzzer:test.local", "@x:y", "DEV", "signed_curve25519:A", "ed25519:k"])
shaped: st.SearchStrategy[Any] = st.recursive(
    json_values,
    lambda children: st.dictionaries(st.sampled_from(FIELDS) | NAMES, children, max_size=4),
    max_leaves=16,
)
ROUTES = [
    ("POST", "/keys/upload"),
    ("POST", "/keys/query"),
    ("POST", "/keys/claim"),
    ("GET", "/keys/changes"),
    ("POST", "/keys/device_signing/upload"),
    ("POST", "/keys/signatures/upload"),
    ("GET", "/devices"),
    ("PUT", "/devices/{id}"),
    ("DELETE", "/devices/{id}"),
    ("POST", "/delete_devices"),
    ("POST", "/room_keys/version"),
    ("GET", "/room_keys/version"),
    ("PUT", "/room_keys/version/{id}"),
    ("DELETE", "/room_keys/version/{id}"),
    ("PUT", "/room_keys/keys"),
    ("PUT", "/room_keys/keys/{id}"),
    ("PUT", "/room_keys/keys/{id}/{id}"),
    ("GET", "/room_keys/keys/{id}"),
    ("DELETE", "/room_keys/keys"),
]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_e2e_endpoints_never_answer_5xx(target: FuzzTarget, data: st.DataObject) -> None:
    method, template = data.draw(st.sampled_from(ROUTES), label="route")
    segment = st.sampled_from(["1", "2", "DEV", "!r:x", "99999999999999999999"]) | st.text(
        max_size=12
    )
    path = "/_matrix/client/v3" + template
    while "{id}" in path:
        path = path.replace("{id}", quote(data.draw(segment), safe="") or "x", 1)
    query = data.draw(
        st.sampled_from(["", "?version=1", "?version=x", "?from=s0_0_0_0_0_0&to=s1_0_0_0_0_5"])
    )
    body = data.draw(st.dictionaries(st.sampled_from(FIELDS), shaped, max_size=5), label="body")
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    try:
        conn.request(
            method,
            path + query,
            body=orjson.dumps(body),
            headers={"Authorization": f"Bearer {target.token}"},
        )
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    event(f"{resp.status}")
    assert resp.status < 500, (method, path, resp.status, payload[:300])
    decoded = orjson.loads(payload)
    if resp.status >= 400 and not (resp.status == 401 and "flows" in decoded):
        assert decoded["errcode"].startswith("M_"), decoded
