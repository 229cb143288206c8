"""``m.room.server_acl`` evaluation (``federation/acl.py``, what inbound PDUs and EDUs are
checked with) against a naive oracle: a recursive glob matcher and the spec's rules read
literally."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from roomstream.federation import acl


def server_allowed(content: dict[str, Any] | None, server_name: str) -> bool:
    return acl.server_allowed(server_name, content)


ALPHABET = "ab.-1"
globs = st.text(alphabet=ALPHABET + "*?", max_size=6)
hosts = st.text(alphabet=ALPHABET + "AB", min_size=1, max_size=6)


def naive_glob(pattern: str, text: str) -> bool:
    """Does ``pattern`` (``*``, ``?``) match all of ``text``, ignoring case?"""
    if not pattern:
        return not text
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        return any(naive_glob(rest, text[i:]) for i in range(len(text) + 1))
    if not text:
        return False
    if head == "?" or head.lower() == text[0].lower():
        return naive_glob(rest, text[1:])
    return False


def oracle(content: dict[str, Any], host: str) -> bool:
    if any(naive_glob(p, host) for p in content.get("deny", [])):
        return False
    return any(naive_glob(p, host) for p in content.get("allow", []))


@given(
    allow=st.lists(globs, max_size=3),
    deny=st.lists(globs, max_size=3),
    host=hosts,
    port=st.none() | st.integers(min_value=1, max_value=65535),
)
def test_allow_and_deny_globs_follow_the_oracle(
    allow: list[str], deny: list[str], host: str, port: int | None
) -> None:
    content = {"allow": allow, "deny": deny}
    server_name = host if port is None else f"{host}:{port}"
    # The port is never part of the comparison.
    assert server_allowed(content, server_name) == oracle(content, host)


def test_the_spec_cases() -> None:
    assert server_allowed(None, "anything.test")
    assert not server_allowed({}, "anything.test")  # no allow list: nobody
    acl = {"allow": ["*"], "deny": ["evil.test", "*.evil.test"], "allow_ip_literals": False}
    assert server_allowed(acl, "good.test:8448")
    assert not server_allowed(acl, "EVIL.test")
    assert not server_allowed(acl, "sub.evil.test")
    assert not server_allowed(acl, "1.2.3.4:8448")
    assert not server_allowed(acl, "[::1]:8448")
    assert server_allowed({"allow": ["*"]}, "1.2.3.4")  # IP literals allowed by default
    # Malformed entries are ignored, not fatal.
    assert server_allowed({"allow": ["*", 3], "deny": [None]}, "ok.test")
    assert not server_allowed({"allow": "*"}, "ok.test")
