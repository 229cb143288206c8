"""m.room.server_acl evaluation: the spec's rules as a table, Synapse's function as the
oracle on generated ACLs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomstream.federation.acl import host_of, server_allowed

SPEC_EXAMPLE = {"allow": ["*"], "allow_ip_literals": False, "deny": ["*.evil.com", "evil.com"]}


@pytest.mark.parametrize(
    ("server", "acl", "allowed"),
    [
        ("any.example", None, True),  # no ACL event: allowed
        ("good.example", SPEC_EXAMPLE, True),
        ("good.example:8448", SPEC_EXAMPLE, True),
        ("evil.com", SPEC_EXAMPLE, False),
        ("sub.evil.com:443", SPEC_EXAMPLE, False),
        ("EVIL.COM", SPEC_EXAMPLE, False),  # case-insensitive
        ("notevil.com", SPEC_EXAMPLE, True),
        ("1.2.3.4", SPEC_EXAMPLE, False),  # IP literal refused
        ("[::1]:8448", SPEC_EXAMPLE, False),
        ("1.2.3.4", {"allow": ["*"]}, True),  # allow_ip_literals defaults to true
        ("1.2.3.4", {"allow": ["*"], "allow_ip_literals": "no"}, True),  # not a bool
        ("a.example", {}, False),  # no allow list: nobody
        ("a.example", {"allow": "*"}, False),  # not a list: ignored
        ("a.example", {"allow": [1, "a.exampl?"]}, True),
        ("ab.example", {"allow": ["a?.example"], "deny": [None]}, True),
        ("a.example", {"allow": ["*"], "deny": ["a.example"]}, False),  # deny first
    ],
)
def test_spec_table(server: str, acl: dict[str, Any] | None, allowed: bool) -> None:
    assert server_allowed(server, acl) is allowed


def test_host_of() -> None:
    assert host_of("a.example:80") == "a.example"
    assert host_of("[::1]:80") == "[::1]"
    assert host_of("[::1]") == "[::1]"
    assert host_of("1.2.3.4") == "1.2.3.4"


glob_entries = st.lists(st.text(alphabet="ab.*?1:[]", max_size=6), max_size=3)
servers = st.text(alphabet="ab.1", min_size=1, max_size=6) | st.sampled_from(
    ["1.2.3.4", "[::1]", "a.b:80", "[::1]:8", "A.B"]
)


@settings(max_examples=300, deadline=None)
@given(
    server=servers,
    allow=glob_entries,
    deny=glob_entries,
    ip=st.sampled_from([True, False, None]),
)
def test_agrees_with_synapse(
    server: str, allow: list[str], deny: list[str], ip: bool | None
) -> None:
    from synapse.synapse_rust.acl import ServerAclEvaluator
    from synapse.util.stringutils import parse_server_name

    content: dict[str, Any] = {"allow": allow, "deny": deny}
    if ip is not None:
        content["allow_ip_literals"] = ip
    evaluator = ServerAclEvaluator(ip is not False, allow, deny)
    # Synapse strips the port before asking (FederationServer's parse_server_name).
    host, _port = parse_server_name(server)
    assert server_allowed(server, content) is evaluator.server_matches_acl_event(host)
