"""End-to-end encryption's server side: device keys, one-time and fallback keys,
cross-signing, key backup, and the ``device_lists`` stream (docs/client_api.md).

Layout: pure rules (:mod:`~roomstream.e2e.signatures`, :mod:`~roomstream.e2e.backup_rule`),
one SQL module per table group (each table written only by its module), and the services
the client layer calls (:class:`~roomstream.e2e.service.E2eKeys`, :class:`~roomstream.e2e.
backup.KeyBackup`). Nothing here knows about HTTP.
"""

from roomstream.e2e.service import E2eKeys

__all__ = ["E2eKeys"]
