"""The identifier grammars of :mod:`roomstream.grammar` against a naive reading of the
spec's appendix "Identifier Grammar": each oracle below walks the string character by
character as the spec's prose describes it, with no regular expression."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.grammar import (
    MAX_ID_BYTES,
    is_event_id,
    is_hashed_event_id,
    is_new_user_id,
    is_new_user_localpart,
    is_opaque_id,
    is_pdu_sender,
    is_room_alias,
    is_room_id,
    is_room_id_for_version,
    is_room_id_to_look_up,
    is_server_name,
    is_user_id,
    split_user_id,
    utf8_length,
)

# --- the oracles ----------------------------------------------------------------------

DIGIT = "0123456789"
ALPHA = string.ascii_letters
IPV6_CHARS = DIGIT + "ABCDEF" + "abcdef" + ":."
DNS_CHARS = DIGIT + ALPHA + "-."
USER_ID_CHARS = DIGIT + string.ascii_lowercase + "-.=_/+"
URLSAFE_BASE64 = DIGIT + ALPHA + "-_"
STANDARD_BASE64 = DIGIT + ALPHA + "+/"


def fits(value: str) -> bool:
    """At most 255 bytes, counted in UTF-8."""
    return len(value.encode("utf-8")) <= 255


def naive_server_name(value: str) -> bool:
    """hostname [ ":" port ]; hostname = IPv4 / "[" IPv6 "]" / dns-name."""
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            return False
        host, rest = value[: close + 1], value[close + 1 :]
    else:
        colon = value.find(":")
        host, rest = (value, "") if colon < 0 else (value[:colon], value[colon:])
    if rest:
        # ":" port, port = 1*5DIGIT
        port = rest[1:]
        if rest[0] != ":" or not 1 <= len(port) <= 5:
            return False
        for c in port:
            if c not in DIGIT:
                return False
    if host.startswith("["):
        # IPv6address = 2*45IPv6char
        inner = host[1:-1]
        if not 2 <= len(inner) <= 45:
            return False
        return all(c in IPV6_CHARS for c in inner)
    # IPv4address is four dot-separated groups of 1 to 3 digits: all of them dns-chars,
    # so whatever is an IPv4 address is also a dns-name (dns-name = 1*255dns-char).
    if not 1 <= len(host) <= 255:
        return False
    return all(c in DNS_CHARS for c in host)


def naive_split(value: str, sigil: str) -> tuple[str, str] | None:
    """``sigil`` localpart ":" rest, split at the first ":"; None without either."""
    if not value.startswith(sigil):
        return None
    body = value[len(sigil) :]
    for i, c in enumerate(body):
        if c == ":":
            return body[:i], body[i + 1 :]
    return None


def naive_user_id(value: object, allowed: str | None, *, empty_ok: bool = False) -> bool:
    """``@`` localpart ":" server_name, at most 255 bytes; localpart characters from
    ``allowed`` (None: any but NUL)."""
    if not isinstance(value, str) or not fits(value):
        return False
    parts = naive_split(value, "@")
    if parts is None:
        return False
    localpart, server = parts
    if not localpart and not empty_ok:
        return False
    for c in localpart:
        if allowed is None and c == "\0":
            return False
        if allowed is not None and c not in allowed:
            return False
    return naive_server_name(server)


# extended_user_id_char = %x21-39 / %x3B-7E
HISTORICAL_CHARS = "".join(chr(c) for c in range(0x21, 0x7F) if c != 0x3A)


def naive_opaque_id(value: str, sigil: str, *, empty_ok: bool) -> bool:
    """``sigil`` localpart ":" server_name, at most 255 bytes; the localpart any
    characters but ":" and NUL (rooms IDs' opaque_id, aliases' localpart)."""
    if not fits(value):
        return False
    parts = naive_split(value, sigil)
    if parts is None:
        return False
    localpart, server = parts
    return (empty_ok or localpart != "") and "\0" not in localpart and naive_server_name(server)


def naive_room_id(value: str, from_create_event: bool) -> bool:
    if from_create_event:
        body = value[1:]
        return value.startswith("!") and len(body) == 43 and all(c in URLSAFE_BASE64 for c in body)
    return naive_opaque_id(value, "!", empty_ok=True)


def naive_room_alias(value: str) -> bool:
    return naive_opaque_id(value, "#", empty_ok=False)


# --- strategies -----------------------------------------------------------------------

# Characters that matter to the grammars, some that must be refused, and non-ASCII.
_ALPHABET = "@!#$:[].-_=/+09afAFzZ~ \x7f\x00\n\u00e9\u4e2d\U0001f600"
_pieces = st.one_of(
    st.text(_ALPHABET, max_size=10),
    # Mostly valid localparts, with the ASCII just outside the grammars.
    st.text("az09._=/+A~! \x7f", max_size=6),
)
_servers = st.one_of(
    st.text(_ALPHABET, max_size=10),
    st.sampled_from(["example.org", "1.2.3.4", "[::1]", "[a]", "ex_ample.org", "é.org"]),
    st.builds(lambda n: "[" + "1" * n + "]", st.integers(0, 47)),
    st.builds(lambda n: "a" * n, st.integers(250, 257)),
).flatmap(
    lambda host: st.sampled_from(["", ":", ":8448", ":12345", ":123456", ":x"]).map(
        lambda port: host + port
    )
)


def ids(sigil: str) -> st.SearchStrategy[str]:
    """Strings shaped like an identifier with ``sigil``, and near misses."""
    return st.one_of(
        st.text(_ALPHABET, max_size=16),
        st.builds(lambda local, server: f"{sigil}{local}:{server}", _pieces, _servers),
        # Around the 255-byte bound, with one- and multi-byte characters.
        st.builds(
            lambda n, c, server: sigil + c * n + ":" + server,
            st.integers(0, 130),
            st.sampled_from(["a", "\u00e9", "\u4e2d"]),
            st.sampled_from(["b.example", "b.example:8448"]),
        ),
        st.builds(lambda n: sigil + "a" * n + ":b.example", st.integers(240, 250)),
    )


_hashes = st.one_of(
    st.text(URLSAFE_BASE64 + STANDARD_BASE64 + "=:", min_size=41, max_size=45),
    st.text(URLSAFE_BASE64, min_size=43, max_size=43),
    st.text(STANDARD_BASE64, min_size=43, max_size=43),
)


# --- properties -----------------------------------------------------------------------


@settings(max_examples=400)
@given(_servers)
def test_server_name_agrees_with_the_spec(value: str) -> None:
    assert is_server_name(value) == naive_server_name(value), value


@settings(max_examples=400)
@given(st.one_of(ids("@"), st.integers(), st.none()))
def test_received_user_ids_follow_the_historical_grammar(value: object) -> None:
    assert is_user_id(value) == naive_user_id(value, HISTORICAL_CHARS), value
    if isinstance(value, str):
        expected = naive_split(value, "@") if naive_user_id(value, HISTORICAL_CHARS) else None
        assert split_user_id(value) == expected, value


@settings(max_examples=400)
@given(ids("@"))
def test_produced_user_ids_follow_the_current_grammar(value: str) -> None:
    assert is_new_user_id(value) == naive_user_id(value, USER_ID_CHARS), value
    # What we produce, every server accepts.
    if is_new_user_id(value):
        assert is_user_id(value) and is_pdu_sender(value)


@given(st.text(USER_ID_CHARS + "A:é@ \x00", max_size=8))
def test_new_localpart_follows_the_current_grammar(localpart: str) -> None:
    expected = localpart != "" and all(c in USER_ID_CHARS for c in localpart)
    assert is_new_user_localpart(localpart) == expected, localpart


@settings(max_examples=400)
@given(ids("@"))
def test_pdu_senders_are_lenient(value: str) -> None:
    assert is_pdu_sender(value) == naive_user_id(value, None, empty_ok=True), value
    # Every user ID a server must accept is a sender we accept.
    if is_user_id(value):
        assert is_pdu_sender(value)


@settings(max_examples=400)
@given(st.one_of(ids("!"), _hashes.map(lambda h: "!" + h)))
def test_room_ids_agree_with_the_spec(value: str) -> None:
    for from_create_event in (False, True):
        expected = naive_room_id(value, from_create_event)
        assert is_room_id_for_version(value, from_create_event=from_create_event) == expected
    assert is_room_id(value) == (naive_room_id(value, False) or naive_room_id(value, True))


@given(ids("!"))
def test_room_ids_to_look_up_need_only_the_sigil(value: str) -> None:
    expected = value.startswith("!") and len(value) > 1 and fits(value) and "\0" not in value
    assert is_room_id_to_look_up(value) == expected, value
    # Every well-formed room ID can be looked up.
    if is_room_id(value):
        assert is_room_id_to_look_up(value)


@settings(max_examples=400)
@given(ids("#"))
def test_room_aliases_agree_with_the_spec(value: str) -> None:
    assert is_room_alias(value) == naive_room_alias(value), value


@given(st.one_of(ids("$"), _hashes.map(lambda h: "$" + h), st.integers(), st.none()))
def test_event_ids(value: object) -> None:
    assert is_event_id(value) == (isinstance(value, str) and value.startswith("$") and fits(value))
    if isinstance(value, str):
        body = value[1:]
        shaped = value.startswith("$") and len(body) == 43
        assert is_hashed_event_id(value, url_safe=True) == (
            shaped and all(c in URLSAFE_BASE64 for c in body)
        )
        assert is_hashed_event_id(value, url_safe=False) == (
            shaped and all(c in STANDARD_BASE64 for c in body)
        )
        # Every well-formed event ID passes the lenient check events are held to.
        if is_hashed_event_id(value, url_safe=True) or is_hashed_event_id(value, url_safe=False):
            assert is_event_id(value)


@given(st.text(_ALPHABET, max_size=300))
def test_opaque_ids_and_byte_lengths(value: str) -> None:
    assert (utf8_length(value) <= MAX_ID_BYTES) == fits(value)
    expected = value != "" and fits(value) and all(c.isprintable() for c in value)
    assert is_opaque_id(value) == expected


# --- examples at the edges ------------------------------------------------------------


@pytest.mark.parametrize(
    ("user_id", "produced", "received", "sender"),
    [
        ("@alice:example.org", True, True, True),
        ("@:example.org", False, False, True),  # empty localpart: only on the wire
        ("@a:exa_mple.org", False, False, False),  # "_" is no dns-char
        ("@é:example.org", False, False, True),  # non-ASCII: only on the wire
        ("@Alice:example.org", False, True, True),  # historical: upper case
        ("@!=~:1.2.3.4:80", False, True, True),
        ("@a:[::1]:8448", True, True, True),
        ("@a:[1]", False, False, False),  # an IPv6 literal has at least 2 characters
        ("@a:[" + "1" * 45 + "]", True, True, True),
        ("@a:[" + "1" * 46 + "]", False, False, False),
        ("@a:example.org:12345", True, True, True),
        ("@a:example.org:123456", False, False, False),  # a port has at most 5 digits
        ("@a:example.org:", False, False, False),
        ("@a b:example.org", False, False, True),
        ("@a\x00b:example.org", False, False, False),
        ("alice:example.org", False, False, False),
        ("@alice", False, False, False),
    ],
)
def test_user_id_examples(user_id: str, produced: bool, received: bool, sender: bool) -> None:
    assert is_new_user_id(user_id) == produced
    assert is_user_id(user_id) == received
    assert is_pdu_sender(user_id) == sender


def test_user_ids_are_limited_to_255_bytes() -> None:
    at_limit = "@" + "a" * (255 - len("@:b.example")) + ":b.example"
    assert len(at_limit.encode()) == 255
    assert is_new_user_id(at_limit) and is_user_id(at_limit) and is_pdu_sender(at_limit)
    over = "@a" + at_limit[1:]
    assert not is_new_user_id(over) and not is_user_id(over) and not is_pdu_sender(over)
    # Bytes, not characters: 120 two-byte characters are 240 bytes.
    assert is_pdu_sender("@" + "é" * 120 + ":b.example")
    assert not is_pdu_sender("@" + "é" * 125 + ":b.example")  # 136 characters, 261 bytes


def test_split_user_id() -> None:
    assert split_user_id("@alice:example.org:8448") == ("alice", "example.org:8448")
    assert split_user_id("@a:[::1]") == ("a", "[::1]")
    assert split_user_id("@é:example.org") is None
    assert split_user_id("@:example.org") is None


def test_room_id_examples() -> None:
    v12 = "!" + "A" * 42 + "_"
    assert is_room_id_for_version(v12, from_create_event=True) and is_room_id(v12)
    assert not is_room_id_for_version(v12, from_create_event=False)
    assert not is_room_id("!" + "A" * 42 + "+")  # standard base64 is not a room ID
    assert not is_room_id("!" + "A" * 44)
    assert is_room_id("!opaque:example.org") and is_room_id("!é:example.org")
    assert is_room_id("!:example.org")  # lenient, as it always was
    assert not is_room_id("!x") and not is_room_id("!a:exa_mple.org")
    # Looked up, they are simply not found.
    assert is_room_id_to_look_up("!x") and not is_room_id_to_look_up("!")
    assert not is_room_id_to_look_up("!" + "é" * 128)  # 129 characters, 257 bytes
    # 255 bytes, counted in UTF-8: 2-byte characters count twice.
    assert is_room_id("!" + "é" * 121 + ":b.example")  # 253 bytes
    assert not is_room_id("!" + "é" * 123 + ":b.example")  # 257 bytes, 134 characters


def test_room_alias_examples() -> None:
    assert is_room_alias("#room:example.org") and is_room_alias("#é:example.org:8448")
    assert not is_room_alias("#:example.org")
    assert not is_room_alias("#room")
    assert not is_room_alias("#ro\x00om:example.org")
    assert not is_room_alias("!room:example.org")
    at_limit = "#" + "a" * (255 - len("#:b.example")) + ":b.example"
    assert is_room_alias(at_limit) and not is_room_alias("#a" + at_limit[1:])
    assert not is_room_alias("#" + "é" * 123 + ":b.example")  # 134 characters, 257 bytes


def test_event_id_examples() -> None:
    assert is_hashed_event_id("$" + "a" * 42 + "-", url_safe=True)
    assert not is_hashed_event_id("$" + "a" * 42 + "-", url_safe=False)
    assert is_hashed_event_id("$" + "a" * 42 + "/", url_safe=False)
    # Lenient: v1-2's "$opaque:server" and anything else with the sigil, up to 255 bytes.
    assert is_event_id("$abc:example.org") and is_event_id("$x")
    assert not is_event_id("abc") and not is_event_id("$" + "a" * 255)


@pytest.mark.parametrize(
    ("server_name", "valid"),
    [
        ("example.org", True),
        ("1.2.3.4", True),
        ("1.2.3.4:1234", True),
        ("[1234:5678::abcd]", True),
        ("[1234:5678::abcd]:5678", True),
        ("[::]", True),  # the IPv6 literal is 2 characters
        ("[:]", False),
        ("[" + "0" * 45 + "]", True),
        ("[" + "0" * 46 + "]", False),
        ("[::g]", False),
        ("example.org:65535", True),
        ("example.org:655350", False),
        ("example.org:", False),
        ("exa_mple.org", False),
        ("é.org", False),
        ("a" * 255, True),
        ("a" * 256, False),
        ("", False),
    ],
)
def test_server_name_examples(server_name: str, valid: bool) -> None:
    assert is_server_name(server_name) == valid
