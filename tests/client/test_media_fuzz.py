"""The media endpoints driven with random path values (a real media ID among them), query
parameters, content types, file names and bodies: every answer is content or a Matrix
JSON error, never a 5xx. (tests/client/test_fuzz.py drives every endpoint with JSON
bodies; this one with what media requests carry.)"""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from urllib.parse import quote, urlencode

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import FuzzTarget
from tests.support.homeserver import SERVER_NAME

QUERY = ["width", "height", "method", "animated", "timeout_ms", "filename", "allow_remote", "url"]
query_values = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0", "1", "32", "-1", "crop", "scale", "true", "false", "99999999999"]),
    st.integers(1, 2000).map(str),
)
content_types = st.one_of(
    st.sampled_from(["image/png", "image/gif", "image/jpeg", "text/html", "", "a/b; x=y"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
)
PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x02\x00\x00\x00\x02\x08\x02\x00\x00\x00"
    b"\xfd\xd4\x9as\x00\x00\x00\x16IDATx\x9cc\xf8\xcf\xc0\xc0\xf0\x9f\x81\x81\x81\xe1?\x03"
    b"\x00\x1f\xe6\x04\xfc\xd7\x1e\xfb\xc6\x00\x00\x00\x00IEND\xaeB`\x82"
)
bodies = st.one_of(st.binary(max_size=300), st.just(PNG), st.just(PNG[:40]))


def _request(
    target: FuzzTarget, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type", "")
    finally:
        conn.close()


@pytest.fixture(scope="module")
def media_id(target: FuzzTarget) -> Iterator[str]:
    """A real image on the fuzz target's server."""
    status, body, _ = _request(
        target,
        "POST",
        "/_matrix/media/v3/upload",
        PNG,
        {"Authorization": f"Bearer {target.token}", "Content-Type": "image/png"},
    )
    assert status == 200, body
    yield orjson.loads(body)["content_uri"].rsplit("/", 1)[1]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_media_endpoints_never_answer_5xx(
    target: FuzzTarget, media_id: str, data: st.DataObject
) -> None:
    routes = [(m, p) for m, p in target.routes if "/media/" in p]
    method, template = data.draw(st.sampled_from(routes), label="route")

    def fill(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[0]
        if name == "api_version":
            return data.draw(st.sampled_from(["v3", "r0", "v1"]))
        known = {"server_name": SERVER_NAME, "media_id": media_id}.get(name)
        choices = [st.text(max_size=30)]
        if known is not None:
            choices = [st.just(known)] * 4 + [st.just("matrix.org"), *choices]
        value = data.draw(st.one_of(*choices), label=name)
        return quote(value, safe="") or "x"

    path = re.sub(r"\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", fill, template)
    query = data.draw(st.dictionaries(st.sampled_from(QUERY), query_values, max_size=5))
    if query.get("timeout_ms", "0").isdigit():
        query["timeout_ms"] = "0"  # a pending media ID would be waited for
    if query:
        path += "?" + urlencode(query)
    headers = {"Content-Type": data.draw(content_types, label="content_type")}
    token = data.draw(st.sampled_from([target.token] * 5 + [None, "bogus"]), label="token")
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = data.draw(bodies, label="body") if method in ("POST", "PUT") else None
    status, payload, content_type = _request(target, method, path, body, headers)
    event(str(status))
    assert status < 500, (method, path, status, payload[:300])
    if status >= 400 or content_type.startswith("application/json"):
        decoded = orjson.loads(payload)
        if status >= 400:
            assert decoded["errcode"].startswith("M_"), decoded
