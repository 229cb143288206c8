"""The ``X-Matrix`` authorization of federation requests: a pure codec, no I/O.

Every request between homeservers carries (Server-Server API, "Request Authentication")::

    Authorization: X-Matrix origin="a.example",destination="b.example",key="ed25519:k",sig="…"

where ``sig`` is the origin's ed25519 signature (unpadded base64) of the canonical JSON of
``{"method", "uri", "origin", "destination", "content"?}`` (``content``: the request's
JSON body, absent when it has none; ``uri``: the path with its query string exactly as
sent).

Parsing follows the spec's grammar (RFC 9110 ``auth-param``s) and is as lenient as
Synapse's ``_parse_auth_header`` where the spec says to be: the scheme is matched without
regard to case, parameter names too, parameters come in any order, values may be tokens
or quoted strings (``\\`` escaping the next character), whitespace around commas is
allowed, unknown parameters are ignored and ``destination`` may be absent (older servers;
the receiver then assumes itself). Anything else (no scheme, a parameter without ``=``, an
unterminated quoted string, ``origin``/``key``/``sig`` missing, an origin that is no
server name) is :class:`MalformedXMatrixError`, the only exception :func:`parse` raises.

Building quotes every value (escaping ``"`` and ``\\``), which Synapse's parser and ours
both read back unchanged.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from signedjson.sign import SignatureVerifyException, sign_json, verify_signed_json

from roomstream.events.signing import SigningKey, VerifyKey, key_id
from roomstream.grammar import is_server_name

__all__ = [
    "SCHEME",
    "MalformedXMatrixError",
    "XMatrixAuth",
    "authorization_header",
    "parse",
    "request_json",
    "sign_request",
    "verify_request",
]

SCHEME = "X-Matrix"
#: Characters of an RFC 9110 ``token`` (a parameter name, or an unquoted value).
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits)
#: Unquoted values also take what server names and key IDs hold (":" of a port or key
#: ID, "[" "]" of an IPv6 literal) and base64's "/" and "=" : Synapse sends the origin
#: unquoted and reads any character up to the next comma.
_BARE_VALUE_CHARS = _TOKEN_CHARS | frozenset(":[]/=")
_WHITESPACE = " \t"


class MalformedXMatrixError(ValueError):
    """An ``Authorization`` header that is no usable ``X-Matrix`` authorization."""


@dataclass(frozen=True)
class XMatrixAuth:
    """One parsed ``X-Matrix`` authorization. ``destination`` is None when absent."""

    origin: str
    key_id: str
    signature: str
    destination: str | None


def request_json(
    method: str, uri: str, origin: str, destination: str, content: object | None
) -> dict[str, Any]:
    """The object whose signature authenticates a request (without ``signatures``)."""
    signed: dict[str, Any] = {
        "method": method,
        "uri": uri,
        "origin": origin,
        "destination": destination,
    }
    if content is not None:
        signed["content"] = content
    return signed


def sign_request(
    method: str,
    uri: str,
    origin: str,
    destination: str,
    content: object | None,
    signing_key: SigningKey,
) -> XMatrixAuth:
    """``origin``'s authorization of one request to ``destination``."""
    signed = sign_json(request_json(method, uri, origin, destination, content), origin, signing_key)
    return XMatrixAuth(
        origin=origin,
        key_id=key_id(signing_key),
        signature=signed["signatures"][origin][key_id(signing_key)],
        destination=destination,
    )


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def authorization_header(auth: XMatrixAuth) -> str:
    """The ``Authorization`` header's value for ``auth`` (every value quoted)."""
    params = [("origin", auth.origin)]
    if auth.destination is not None:
        params.append(("destination", auth.destination))
    params += [("key", auth.key_id), ("sig", auth.signature)]
    return SCHEME + " " + ",".join(f"{name}={_quote(value)}" for name, value in params)


def _skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _params(text: str) -> dict[str, str]:
    """The ``name=value`` pairs of an ``auth-param`` list (names lower-cased; a name
    given twice keeps its last value, as Synapse's dictionary does)."""
    params: dict[str, str] = {}
    i = 0
    while True:
        i = _skip_whitespace(text, i)
        start = i
        while i < len(text) and text[i] in _TOKEN_CHARS:
            i += 1
        name = text[start:i].lower()
        if not name:
            raise MalformedXMatrixError(f"expected a parameter name at character {start}")
        i = _skip_whitespace(text, i)
        if i >= len(text) or text[i] != "=":
            raise MalformedXMatrixError(f"parameter {name!r} has no '='")
        i = _skip_whitespace(text, i + 1)
        if i < len(text) and text[i] == '"':
            i += 1
            chars: list[str] = []
            while True:
                if i >= len(text):
                    raise MalformedXMatrixError(f"parameter {name!r}: unterminated quoted string")
                c = text[i]
                if c == '"':
                    i += 1
                    break
                if c == "\\":
                    if i + 1 >= len(text):
                        raise MalformedXMatrixError(f"parameter {name!r}: dangling backslash")
                    c = text[i + 1]
                    i += 1
                chars.append(c)
                i += 1
            value = "".join(chars)
        else:
            start = i
            while i < len(text) and text[i] in _BARE_VALUE_CHARS:
                i += 1
            value = text[start:i]
        params[name] = value
        i = _skip_whitespace(text, i)
        if i >= len(text):
            return params
        if text[i] != ",":
            raise MalformedXMatrixError(f"unexpected {text[i]!r} after parameter {name!r}")
        i += 1


def parse(header: str) -> XMatrixAuth:
    """Parse one ``Authorization`` header value (see the module docstring);
    :class:`MalformedXMatrixError` and nothing else for anything unusable."""
    scheme, sep, rest = header.partition(" ")
    if scheme.lower() != SCHEME.lower() or not sep:
        raise MalformedXMatrixError("not an X-Matrix authorization")
    params = _params(rest)
    missing = [name for name in ("origin", "key", "sig") if not params.get(name)]
    if missing:
        raise MalformedXMatrixError(f"X-Matrix authorization without {', '.join(missing)}")
    origin = params["origin"]
    if not is_server_name(origin):
        raise MalformedXMatrixError(f"origin {origin!r} is not a server name")
    destination = params.get("destination")
    return XMatrixAuth(
        origin=origin, key_id=params["key"], signature=params["sig"], destination=destination
    )


def verify_request(
    auth: XMatrixAuth,
    method: str,
    uri: str,
    destination: str,
    content: object | None,
    verify_key: VerifyKey,
) -> bool:
    """Whether ``auth``'s signature, by ``verify_key`` (which must be the key
    ``auth.key_id`` names), covers this request to ``destination``. Never raises."""
    if key_id(verify_key) != auth.key_id:
        return False
    signed = request_json(method, uri, auth.origin, destination, content)
    signed["signatures"] = {auth.origin: {auth.key_id: auth.signature}}
    try:
        verify_signed_json(signed, auth.origin, verify_key)
    except (SignatureVerifyException, ValueError, TypeError):
        return False
    return True
