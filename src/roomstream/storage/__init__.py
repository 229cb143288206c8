"""The database layer: one async interface (:class:`Database`) over two engines.

SQL is written once with ``?`` placeholders; engines translate where needed. Work runs
as *interactions*: a plain function given a :class:`Transaction`, executed on a worker
thread so the event loop never blocks, committed on return, rolled back on exception
and retried on serialization failures and deadlocks.
"""

from roomstream.storage.database import Database, Transaction, connect
from roomstream.storage.engines import DatabaseConfig, DatabaseUnavailableError, Engine
from roomstream.storage.migrations import prepare_database

__all__ = [
    "Database",
    "DatabaseConfig",
    "DatabaseUnavailableError",
    "Engine",
    "Transaction",
    "connect",
    "prepare_database",
]
