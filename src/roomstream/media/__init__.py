"""The media repository (issue 21 §1): uploads, downloads and thumbnails of this server's
media, with no HTTP in it (the handlers are :mod:`roomstream.client.media_routes`).

- :mod:`~roomstream.media.repository`: the service (:class:`MediaRepository`) and its
  rules: sizes, quota, asynchronous uploads, who may download what, thumbnails;
- :mod:`~roomstream.media.blobs`: where content lives, by SHA-256 (the narrow
  :class:`~roomstream.media.blobs.BlobStore` interface; local files implemented);
- :mod:`~roomstream.media.metadata`: the ``media`` and ``media_thumbnails`` tables;
- :mod:`~roomstream.media.thumbnails`: Pillow (sizes, decoding limits, rendering);
- :mod:`~roomstream.media.safety`: the headers that make serving users' files safe.
"""

from __future__ import annotations

from roomstream.config import Config
from roomstream.media.blobs import BlobStore, LocalBlobStore
from roomstream.media.repository import Download, MediaRepository
from roomstream.storage import Database

__all__ = ["BlobStore", "Download", "LocalBlobStore", "MediaRepository", "open_media"]


def open_media(config: Config, db: Database) -> MediaRepository:
    """The configured media repository (its store's directory created if missing)."""
    store: BlobStore = LocalBlobStore(config.media_store())
    return MediaRepository(db, config.server_name, config.media, store)
