"""The account-management, discovery and guest endpoints driven with random bodies,
path values, query parameters and tokens (a user's, a guest's, none, bogus), on a
server with guest access on: never a 5xx, every error a Matrix one; and a guest's token
on every route is refused as a guest's (403 ``M_GUEST_ACCESS_FORBIDDEN``) or answered,
never a 5xx."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from urllib.parse import quote, urlencode

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import FuzzTarget, json_values, serve_fuzz_target

#: The routes of this slice (paths as the fuzz target lists them).
OURS = re.compile(
    r"/(account/(password|deactivate|3pid)|voip/|thirdparty/|register)|^/\.well-known/"
)
KEYS = [
    "new_password",
    "logout_devices",
    "auth",
    "three_pid_creds",
    "threePidCreds",
    "client_secret",
    "sid",
    "medium",
    "address",
    "id_server",
    "id_access_token",
    "erase",
    "guest_access_token",
    "username",
    "password",
    "initial_device_display_name",
    "device_id",
    "inhibit_login",
]
AUTH = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["m.login.password", "m.login.dummy", "x"]) | json_values,
        "session": json_values,
        "password": json_values,
        "user": json_values,
        "identifier": json_values,
    },
)
bodies = st.one_of(
    st.dictionaries(st.sampled_from(KEYS), json_values | AUTH, max_size=6),
    json_values,
    st.binary(max_size=30),
)
queries = st.dictionaries(
    st.sampled_from(["kind", "access_token", "alias", "username"]),
    st.sampled_from(["guest", "user", "", "x"]) | st.text(max_size=10),
    max_size=2,
)


@pytest.fixture(scope="module")
def guest_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FuzzTarget, str]]:
    """The fuzz server with guest access on, and a guest's token on it."""
    for target in serve_fuzz_target(tmp_path_factory, allow_guest_access=True):
        status, answer = request(target, "POST", "/_matrix/client/v3/register?kind=guest", b"{}")
        assert status == 200, answer
        yield target, str(orjson.loads(answer)["access_token"])


def request(
    target: FuzzTarget, method: str, path: str, body: bytes | None, token: str | None = None
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    try:
        conn.request(
            method,
            path,
            body=body if method in ("POST", "PUT") else None,
            headers={k: v.encode("utf-8").decode("latin-1") for k, v in headers.items()},
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def fill_path(target: FuzzTarget, template: str, data: st.DataObject) -> str:
    def fill(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[0]
        if name == "api_version":
            return "v3"
        known = {"room_id": target.room_id, "user_id": target.user_id, "room": target.room_id}
        choices = [st.text(max_size=20)]
        if name in known:
            choices = [st.just(known[name])] * 3 + choices
        return quote(data.draw(st.one_of(*choices), label=name), safe="")

    return re.sub(r"\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", fill, template)


def check_answer(method: str, path: str, status: int, payload: bytes) -> None:
    assert status < 500, (method, path, status, payload[:300])
    decoded = orjson.loads(payload)
    if status >= 400:
        assert isinstance(decoded, dict), decoded
        if status == 401 and "flows" in decoded:
            return  # user-interactive auth: the flows, no errcode (spec)
        assert decoded["errcode"].startswith("M_"), decoded


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_account_endpoints_never_answer_5xx(
    guest_target: tuple[FuzzTarget, str], data: st.DataObject
) -> None:
    target, guest_token = guest_target
    ours = sorted({r for r in target.routes if OURS.search(r[1].replace("/_matrix/client/v3", ""))})
    assert len(ours) >= 20  # the slice's routes are there
    method, template = data.draw(st.sampled_from(ours), label="route")
    method = data.draw(st.sampled_from([method] * 6 + ["GET", "POST", "PUT", "DELETE"]))
    path = fill_path(target, template, data)
    query = data.draw(queries, label="query")
    if query:
        path += "?" + urlencode(query)
    token = data.draw(
        st.sampled_from([target.token] * 3 + [guest_token] * 3 + [None, "rsg_bogus", "\u00e9"]),
        label="token",
    )
    body = data.draw(bodies, label="body")
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    status, payload = request(target, method, path, raw, token)
    event(f"{status}")
    check_answer(method, path, status, payload)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_guest_token_on_any_route(
    guest_target: tuple[FuzzTarget, str], data: st.DataObject
) -> None:
    target, guest_token = guest_target
    method, template = data.draw(st.sampled_from(target.routes), label="route")
    path = fill_path(target, template, data)
    if template.endswith("/events") or template.endswith("/sync"):
        path += "?timeout=0"  # a long poll would only wait
    body = data.draw(st.one_of(st.just({}), json_values), label="body")
    status, payload = request(target, method, path, orjson.dumps(body), guest_token)
    event(f"{status}")
    check_answer(method, path, status, payload)
