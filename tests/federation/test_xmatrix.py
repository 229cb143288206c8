"""The X-Matrix codec: round trips, Synapse's signing and parsing on the same inputs, and
a parser that raises nothing but its named error whatever it is given."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from signedjson.key import generate_signing_key, get_verify_key

from roomstream.federation import xmatrix
from roomstream.federation.xmatrix import MalformedXMatrixError, XMatrixAuth

KEY = generate_signing_key("k1")
OTHER_KEY = generate_signing_key("k1")

server_names = st.from_regex(r"[a-z0-9][a-z0-9.\-]{0,20}(:[0-9]{1,5})?", fullmatch=True)
URI = r"/_matrix/federation/v1/[A-Za-z0-9%!$:@._~\-/]{0,30}(\?[a-z=&0-9]{0,10})?"
contents = st.none() | st.dictionaries(
    st.text(max_size=8), st.integers(-(2**53), 2**53) | st.text(max_size=8), max_size=4
)


@settings(max_examples=60, deadline=None)
@given(
    origin=server_names,
    destination=server_names,
    method=st.sampled_from(["GET", "PUT", "POST"]),
    uri=st.from_regex(URI, fullmatch=True),
    content=contents,
)
def test_round_trip_signs_and_verifies(
    origin: str, destination: str, method: str, uri: str, content: object
) -> None:
    auth = xmatrix.sign_request(method, uri, origin, destination, content, KEY)
    parsed = xmatrix.parse(xmatrix.authorization_header(auth))
    assert parsed == auth
    verify = get_verify_key(KEY)
    assert xmatrix.verify_request(parsed, method, uri, destination, content, verify)
    # Anything else signed differently does not verify.
    assert not xmatrix.verify_request(parsed, method, uri + "x", destination, content, verify)
    assert not xmatrix.verify_request(parsed, method, uri, destination + "x", content, verify)
    assert not xmatrix.verify_request(parsed, method, uri, destination, {"other": 1}, verify)
    assert not xmatrix.verify_request(
        parsed, method, uri, destination, content, get_verify_key(OTHER_KEY)
    )


class _SynapseClient:
    """What Synapse's ``build_auth_headers`` reads of its client."""

    def __init__(self, server_name: str) -> None:
        self.server_name = server_name
        self.signing_key = KEY


@pytest.mark.parametrize(
    "content", [None, {}, {"pdus": [{"a": "é", "n": 1}], "edus": []}, {"x": ["\u2028", 2]}]
)
@pytest.mark.parametrize("uri", ["/_matrix/federation/v1/version", "/_matrix/key/v2/query?x=%21a"])
def test_same_header_as_synapse(content: object, uri: str) -> None:
    """Synapse's own signing gives the same signature; its parser reads our header."""
    from synapse.federation.transport.server._base import _parse_auth_header
    from synapse.http.matrixfederationclient import MatrixFederationHttpClient

    (theirs,) = MatrixFederationHttpClient.build_auth_headers(
        _SynapseClient("origin.example:8448"),  # type: ignore[arg-type]
        b"dest.example",
        b"PUT",
        uri.encode(),
        content,  # type: ignore[arg-type]
    )
    ours = xmatrix.sign_request("PUT", uri, "origin.example:8448", "dest.example", content, KEY)
    assert xmatrix.parse(theirs.decode()) == ours
    header = xmatrix.authorization_header(ours)
    assert _parse_auth_header(header.encode()) == (
        ours.origin,
        ours.key_id,
        ours.signature,
        ours.destination,
    )


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            'X-Matrix origin=a.example,key="ed25519:1",sig="c2ln",destination="b.example"',
            XMatrixAuth("a.example", "ed25519:1", "c2ln", "b.example"),
        ),
        # any order, names and scheme without regard to case, spaces around commas
        (
            'x-matrix SIG="c2ln" , Key="ed25519:1",\tOrigin="a.example:8448"',
            XMatrixAuth("a.example:8448", "ed25519:1", "c2ln", None),
        ),
        # unknown parameters ignored; quoted-pair escapes
        (
            'X-Matrix origin="a.example",future="x,\\"y\\"",key=ed25519:1,sig=c2l/+n',
            XMatrixAuth("a.example", "ed25519:1", "c2l/+n", None),
        ),
        (
            'X-Matrix origin="[::1]:80",key="ed25519:\\\\",sig="s",destination=""',
            XMatrixAuth("[::1]:80", "ed25519:\\", "s", ""),
        ),
    ],
)
def test_parse_table(header: str, expected: XMatrixAuth) -> None:
    assert xmatrix.parse(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer abc",
        "X-Matrix",
        "X-Matrixorigin=a,key=b,sig=c",
        'X-Matrix origin="a.example",key="k"',  # no sig
        'X-Matrix key="k",sig="s"',  # no origin
        'X-Matrix origin="a.example",key="",sig="s"',  # empty key
        'X-Matrix origin="not a server",key="k",sig="s"',
        'X-Matrix origin="a.example,key="k",sig="s"',  # unterminated quote
        'X-Matrix origin="a.example",key="k",sig="s\\',
        "X-Matrix origin,key=k,sig=s",
        'X-Matrix origin="a.example" key="k",sig="s"',
        "X-Matrix origin=a.example,,key=k,sig=s",
    ],
)
def test_malformed_headers(header: str) -> None:
    with pytest.raises(MalformedXMatrixError):
        xmatrix.parse(header)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(max_size=80),
        st.text(alphabet='X-Matrix origin=key,sig"\\ \t:abc', max_size=80).map(
            lambda s: "X-Matrix " + s
        ),
    )
)
def test_parser_raises_only_its_error(header: str) -> None:
    try:
        auth = xmatrix.parse(header)
    except MalformedXMatrixError:
        return
    assert auth.origin and auth.key_id and auth.signature
