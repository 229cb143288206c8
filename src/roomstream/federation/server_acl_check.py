"""``m.room.server_acl`` evaluation, standing in until fedtransport's ``federation/acl.py``
is merged: on merge, :func:`server_allowed` is replaced by (or delegates to) that module,
and this file goes.

The spec's rules (Server-Server API, "Server Access Control Lists"): a server name is
compared without its port; an IP literal is denied when ``allow_ip_literals`` is false
(default true); a name matching any ``deny`` glob is denied; otherwise it is allowed only
if it matches an ``allow`` glob (``allow`` absent or empty: nothing is allowed). Globs:
``*`` any run of characters, ``?`` one character, case-insensitive (as Synapse compiles
them). Malformed entries (not strings) are ignored, as Synapse does.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any


def _host(server_name: str) -> str:
    """The server name without its port (``[::1]:8448`` -> ``[::1]``)."""
    if server_name.startswith("["):
        end = server_name.find("]")
        return server_name[: end + 1] if end != -1 else server_name
    return server_name.rsplit(":", 1)[0] if ":" in server_name else server_name


def _is_ip_literal(host: str) -> bool:
    candidate = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=1024)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile("".join(parts), re.IGNORECASE | re.DOTALL)


def _matches(host: str, patterns: object) -> bool:
    if not isinstance(patterns, list):
        return False
    return any(isinstance(p, str) and _glob(p).fullmatch(host) for p in patterns)


def server_allowed(acl_content: Mapping[str, Any] | None, server_name: str) -> bool:
    """Whether ``server_name`` may take part in a room whose ``m.room.server_acl`` has
    ``acl_content`` (None: the room has no ACL, everyone is allowed)."""
    if acl_content is None:
        return True
    host = _host(server_name)
    if not acl_content.get("allow_ip_literals", True) and _is_ip_literal(host):
        return False
    if _matches(host, acl_content.get("deny")):
        return False
    return _matches(host, acl_content.get("allow"))
