"""The federation listener: the Server-Server API over TLS on ``federation.port``,
separate from the client listener.

What it serves is what its route installers add (:data:`RouteInstaller`, each a
``Callable[[web.Application], None]``): the key endpoints (:mod:`.key_routes`) always;
the process assembly (:func:`roomstream.homeserver.federation_route_installers`) adds
the rooms' and queries' routes. Errors are Matrix JSON through the same middleware as
the other listeners; a path no installer added is 404 ``M_UNRECOGNIZED``. The
connection limits are the ``http`` section's, as on every listener.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence

from aiohttp import web

from roomstream.config import FederationConfig, HttpConfig
from roomstream.httpbase import (
    exact_json_content_type,
    http_metrics_middleware,
    matrix_error_middleware,
)
from roomstream.listener import HttpListener

__all__ = ["MAX_FEDERATION_BODY", "RouteInstaller", "federation_listener", "tls_server_context"]

RouteInstaller = Callable[[web.Application], None]
#: Largest request body (a /send transaction of 50 PDUs and 100 EDUs fits easily;
#: Synapse's limit for federation requests is the same order).
MAX_FEDERATION_BODY = 50 * 1024 * 1024


def tls_server_context(config: FederationConfig) -> ssl.SSLContext:
    """The listener's TLS context, from the configured certificate and key files."""
    if config.tls_certificate_path is None or config.tls_private_key_path is None:
        raise ValueError(
            "the federation listener needs tls_certificate_path and tls_private_key_path"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_certificate_path, config.tls_private_key_path)
    return context


def federation_listener(
    installers: Sequence[RouteInstaller], federation: FederationConfig, limits: HttpConfig
) -> HttpListener:
    """The TLS listener serving what ``installers`` add (start it with
    ``listener.start(federation.bind_host, federation.port)``)."""
    app = web.Application(
        middlewares=[http_metrics_middleware, matrix_error_middleware],
        client_max_size=MAX_FEDERATION_BODY,
    )
    app.on_response_prepare.append(exact_json_content_type)
    for install in installers:
        install(app)
    return HttpListener(app, limits, tls_server_context(federation))
