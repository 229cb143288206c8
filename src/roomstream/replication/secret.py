"""The secret every process of a deployment proves to the others (internal HTTP API, TCP
replication).

It is ``replication.shared_secret`` when configured. Otherwise it is generated at first
start (256 random bits) and kept in ``<data_dir>/replication_secret`` (mode 0600), where
every process of a deployment on one machine finds it. There is always a secret: the
internal API must never trust a caller merely for reaching its port, since "loopback" is
not "trusted" (a reverse proxy or any local user reaches loopback).

Invariant: every process that reads the file sees the same, complete secret, even when
several start at once. The file is written whole under a temporary name and then
hard-linked into place (``os.link`` never replaces an existing file); whoever loses the
race reads the winner's file.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from roomstream.config import Config, ConfigError

__all__ = ["SECRET_FILE", "effective_shared_secret", "load_or_create_secret", "secret_path"]

logger = logging.getLogger(__name__)

#: The generated secret's file name inside ``data_dir``.
SECRET_FILE = "replication_secret"
#: Random bytes in a generated secret (256 bits).
SECRET_BYTES = 32


def secret_path(config: Config) -> Path:
    """Where the generated secret of ``config``'s deployment lives."""
    return Path(config.data_dir) / SECRET_FILE


def effective_shared_secret(config: Config) -> str:
    """The configured ``replication.shared_secret``, else the generated one (created on
    first use). A file that cannot be read or created is a :class:`ConfigError` naming it."""
    if config.replication.shared_secret:
        return config.replication.shared_secret
    return load_or_create_secret(secret_path(config))


def _read(path: Path) -> str:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        logger.warning("replication secret %s is accessible by other users (mode %o)", path, mode)
    secret = path.read_text(encoding="ascii").strip()
    if not secret or not secret.isprintable() or " " in secret:
        raise ConfigError(f"{path}: not a replication secret (delete it to generate a new one)")
    return secret


def load_or_create_secret(path: Path) -> str:
    """The secret in ``path``; if there is none, generate one and store it there
    (race-free between processes, see the module docstring)."""
    try:
        try:
            return _read(path)
        except FileNotFoundError:
            pass
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask may have removed bits; make the mode exact
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_urlsafe(SECRET_BYTES) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
                logger.info("generated the replication secret in %s", path)
            except FileExistsError:
                pass  # another process won the race: everyone uses its secret
        finally:
            tmp.unlink(missing_ok=True)
        return _read(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"replication secret {path}: {reason}") from None
