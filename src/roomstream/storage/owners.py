"""Which module writes each table: every table has exactly one writer module.

A table's owner is the only module whose SQL writes it (``INSERT INTO``, ``UPDATE``,
``DELETE FROM``, ``TRUNCATE``, ``COPY ... FROM`` or ``insert_many``); anything else
that needs to change the table calls a function of the owner (the client API publishes
a room with :func:`roomstream.rooms.persist.set_room_public_txn`; sends record their
transaction IDs through :mod:`roomstream.rooms.transaction_ids`). Migrations
(``storage/schema/*.sql``) are not writers. Reads may be anywhere.

``tests/test_table_owners.py`` scans the sources' string literals and fails for a write
outside the owner, or to a table not listed here. ``docs/tables.md`` says the same in
prose.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BULK_WRITERS", "DYNAMIC_WRITES", "STORAGE_PLUMBING", "TABLE_OWNERS"]

_PERSIST = "roomstream.rooms.persist"
_VIEWS = "roomstream.pipelines.views"

#: Table -> the one module that writes it.
TABLE_OWNERS: Mapping[str, str] = {
    # Rooms and their events: the persister, in one transaction per batch.
    "rooms": _PERSIST,
    "events": _PERSIST,
    "event_json": _PERSIST,
    "event_edges": _PERSIST,
    "event_auth": _PERSIST,
    "event_state": _PERSIST,
    "event_auth_chains": _PERSIST,
    "event_auth_chain_links": _PERSIST,
    "event_forward_extremities": _PERSIST,
    "redactions": _PERSIST,
    "current_state_events": _PERSIST,
    "current_state_delta_stream": _PERSIST,
    "event_txn_ids": "roomstream.rooms.transaction_ids",
    "server_verify_keys": "roomstream.rooms.keys",
    "server_key_responses": "roomstream.rooms.keys",
    # State groups.
    "state_groups": "roomstream.state.groups",
    "state_branches": "roomstream.state.groups",
    "state_entries": "roomstream.state.groups",
    # The read path's visibility records (written by the persister's participant).
    "timeline_events": "roomstream.reading.visibility",
    "visibility_memberships": "roomstream.reading.visibility",
    "visibility_backfill_rooms": "roomstream.reading.backfill",
    "index_backfill_rooms": "roomstream.reading.index_backfill",
    # The relations index (written by the persister's participant).
    "event_relations": "roomstream.reading.relations",
    "threads": "roomstream.reading.relations",
    # The search index (written by the persister's participant).
    "event_search": "roomstream.reading.search",
    # Streams, caches, storage.
    "stream_positions": "roomstream.streams.id_generator",
    "cache_invalidations": "roomstream.caches",
    "roomstream_sequences": "roomstream.storage.engines",
    "schema_version": "roomstream.storage.migrations",
    # Accounts.
    "users": "roomstream.accounts.store",
    "registration_sessions": "roomstream.accounts.store",
    "devices": "roomstream.accounts.store",
    "access_tokens": "roomstream.accounts.store",
    "profiles": "roomstream.accounts.profiles",
    "openid_tokens": "roomstream.accounts.openid",
    "user_ips": "roomstream.accounts.client_ips",
    # The Client-Server API's own data.
    "user_filters": "roomstream.client.store",
    "room_aliases": "roomstream.client.store",
    "room_forgotten": "roomstream.client.store",
    "event_reports": "roomstream.client.reports",
    "room_reports": "roomstream.client.reports",
    "account_data": "roomstream.client.userdata",
    "room_account_data": "roomstream.client.userdata",
    "receipts": "roomstream.client.userdata",
    "device_inbox": "roomstream.client.userdata",
    "device_federation_outbox": "roomstream.client.userdata",
    "to_device_transactions": "roomstream.client.userdata",
    "presence_stream": "roomstream.client.presence_store",
    # End-to-end encryption: device keys, cross-signing, key backup, device lists.
    "e2e_device_keys": "roomstream.e2e.device_keys_store",
    "e2e_one_time_keys": "roomstream.e2e.device_keys_store",
    "e2e_fallback_keys": "roomstream.e2e.device_keys_store",
    "e2e_cross_signing_keys": "roomstream.e2e.cross_signing_store",
    "e2e_signatures": "roomstream.e2e.cross_signing_store",
    "e2e_room_keys_versions": "roomstream.e2e.backup_store",
    "e2e_room_keys": "roomstream.e2e.backup_store",
    "device_lists_stream": "roomstream.e2e.device_lists",
    # Federation: remote users' devices as their servers' EDUs describe them.
    "federation_remote_device_lists": "roomstream.federation.remote_devices",
    "federation_remote_devices": "roomstream.federation.remote_devices",
    "federation_remote_cross_signing": "roomstream.federation.remote_devices",
    # Pushers: the pushers stream's writer, which also delivers.
    "pushers": "roomstream.client.pushers",
    "deleted_pushers": "roomstream.client.pushers",
    # Push rules: the push_rules stream's one writer.
    "push_rules": "roomstream.client.push_store",
    # The media repository.
    "media": "roomstream.media.metadata",
    "media_thumbnails": "roomstream.media.metadata",
    # Pipelines: the derived views and the exactly-once sinks' batch records.
    "view_room_state": _VIEWS,
    "view_room_stats": _VIEWS,
    "view_room_daily_messages": _VIEWS,
    "view_user_stats": _VIEWS,
    "view_user_directory": _VIEWS,
    "view_media_stats": _VIEWS,
    "pipeline_batches": "roomstream.pipelines.sinks",
    # The federation sender: its stream positions, destinations' back-off and catch-up.
    "federation_stream_position": "roomstream.federation.catchup",
    "destinations": "roomstream.federation.catchup",
    "destination_rooms": "roomstream.federation.catchup",
    # Federation, inbound: answered transactions (idempotent /send).
    "federation_received_transactions": "roomstream.federation.transactions",
}

#: Modules whose SQL names the table through a variable, and the tables it may be (each
#: owned by that module).
DYNAMIC_WRITES: Mapping[str, frozenset[str]] = {
    "roomstream.reading.visibility": frozenset({"timeline_events", "visibility_memberships"}),
    "roomstream.e2e.device_keys_store": frozenset(
        {"e2e_device_keys", "e2e_one_time_keys", "e2e_fallback_keys"}
    ),
    _VIEWS: frozenset(t for t, owner in TABLE_OWNERS.items() if owner == _VIEWS),
}

#: Modules that own no table but may write any, in bulk, with the reason. The Spark
#: import's load step copies into the target database, in one transaction, the tables
#: the import's tasks built in scratch databases with the owners' own code (the
#: persister, the visibility recorder, state groups): the rows are the owners'.
BULK_WRITERS: Mapping[str, str] = {
    "roomstream.pipelines.import_load": "the Spark import's load (ATTACH + INSERT ... SELECT"
    " on SQLite, COPY on PostgreSQL) of tables built by the owners' code",
}

#: The storage layer's plumbing: runs a caller's write (``insert_many``: plain INSERTs or
#: COPY) for whatever table the caller names; the caller is the writer.
STORAGE_PLUMBING: frozenset[str] = frozenset(
    {"roomstream.storage.database", "roomstream.storage.engines"}
)
