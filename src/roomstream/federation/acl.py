"""``m.room.server_acl``: which servers may take part in a room (pure, no I/O).

The spec's algorithm (Server-Server API, "Server Access Control Lists"), with Synapse's
leniencies for malformed content (``synapse/event_auth.py`` ``server_matches_acl_event``):

1. no ACL event in the room: every server is allowed (callers pass ``None``);
2. the server name without its port is an IP literal and ``allow_ip_literals`` is
   ``false``: denied (a value that is not a boolean counts as the default, ``true``);
3. it matches a ``deny`` glob: denied;
4. it matches an ``allow`` glob: allowed;
5. otherwise denied (so an ACL without ``allow`` denies everyone).

Globs use ``*`` (any run, possibly empty) and ``?`` (one character), matched without
regard to case (as Synapse's ``glob_to_regex``); entries that are not strings, and
``allow``/``deny`` values that are not lists, are ignored.

Callers (the inbound /send and query handlers) call :func:`server_allowed` with the
room's current ``m.room.server_acl`` content, and raise
:class:`~roomstream.errors.ForbiddenError` (403 ``M_FORBIDDEN``) when it is False.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from roomstream.glob import compile_glob

__all__ = ["host_of", "is_ip_literal", "server_allowed"]


def host_of(server_name: str) -> str:
    """``server_name`` without its port (an IPv6 literal keeps its brackets)."""
    if server_name.startswith("["):
        end = server_name.find("]")
        return server_name[: end + 1] if end != -1 else server_name
    return server_name.rsplit(":", 1)[0] if ":" in server_name else server_name


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` (no port) is an IPv4 address or a bracketed IPv6 one."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _matches_any(host: str, entries: Any) -> bool:
    if not isinstance(entries, list):
        return False
    patterns = (e for e in entries if isinstance(e, str))
    return any(compile_glob(p, wildcards="*?", ignore_case=True).matches(host) for p in patterns)


def server_allowed(server_name: str, acl_content: Mapping[str, Any] | None) -> bool:
    """Whether the room's ACL (its ``m.room.server_acl`` content, None if it has none)
    lets ``server_name`` take part."""
    if acl_content is None:
        return True
    host = host_of(server_name)
    allow_ip_literals = acl_content.get("allow_ip_literals", True)
    if not isinstance(allow_ip_literals, bool):
        allow_ip_literals = True
    if not allow_ip_literals and is_ip_literal(host):
        return False
    if _matches_any(host, acl_content.get("deny", [])):
        return False
    return _matches_any(host, acl_content.get("allow", []))
