-- Stream bookkeeping and the tables behind the streams defined in roomstream.streams.
-- Every stream table has a stream id column and the instance (writer) that wrote the row.

-- The last position each writer of each stream has announced. A writer only announces
-- positions it has stored here, so a reader that restarts never goes backwards.
CREATE TABLE stream_positions (
    stream_name TEXT NOT NULL,
    instance_name TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    PRIMARY KEY (stream_name, instance_name)
);

-- events stream (positive stream orderings) and backfill stream (negative ones).
CREATE TABLE events (
    stream_ordering BIGINT NOT NULL PRIMARY KEY,
    topological_ordering BIGINT NOT NULL,
    event_id TEXT NOT NULL UNIQUE,
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT,
    sender TEXT NOT NULL,
    redacts TEXT,
    relates_to TEXT,
    membership TEXT,
    outlier BOOLEAN NOT NULL DEFAULT FALSE,
    rejected_reason TEXT,
    soft_failed BOOLEAN NOT NULL DEFAULT FALSE,
    origin_server_ts BIGINT NOT NULL,
    received_ts BIGINT NOT NULL,
    instance_name TEXT NOT NULL
);
CREATE INDEX events_room_topological ON events (room_id, topological_ordering, stream_ordering);
CREATE INDEX events_room_stream ON events (room_id, stream_ordering);
CREATE INDEX events_instance_stream ON events (instance_name, stream_ordering);

-- Changes to rooms' current state; rows share the stream id of the event that caused them
-- and are the "state" rows of the events stream.
CREATE TABLE current_state_delta_stream (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT,
    prev_event_id TEXT
);
CREATE INDEX current_state_delta_stream_idx ON current_state_delta_stream (instance_name, stream_id);

-- caches stream: one row per invalidation; keys is a JSON array, or NULL for "everything".
CREATE TABLE cache_invalidations (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    cache_func TEXT NOT NULL,
    keys TEXT,
    invalidation_ts BIGINT NOT NULL
);
CREATE INDEX cache_invalidations_idx ON cache_invalidations (instance_name, stream_id);

-- account_data stream: the union of global and per-room account data.
CREATE TABLE account_data (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    account_data_type TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (user_id, account_data_type)
);
CREATE INDEX account_data_stream_idx ON account_data (instance_name, stream_id);
CREATE TABLE room_account_data (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    account_data_type TEXT NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id, account_data_type)
);
CREATE INDEX room_account_data_stream_idx ON room_account_data (instance_name, stream_id);

-- receipts stream.
CREATE TABLE receipts (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    room_id TEXT NOT NULL,
    receipt_type TEXT NOT NULL,
    user_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    thread_id TEXT,
    data TEXT NOT NULL
);
CREATE INDEX receipts_stream_idx ON receipts (instance_name, stream_id);
CREATE INDEX receipts_room_user_idx ON receipts (room_id, receipt_type, user_id);

-- to_device stream: the union of local device inboxes and the federation outbox.
CREATE TABLE device_inbox (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    message_json TEXT NOT NULL
);
CREATE INDEX device_inbox_stream_idx ON device_inbox (instance_name, stream_id);
CREATE TABLE device_federation_outbox (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    destination TEXT NOT NULL,
    message_id TEXT NOT NULL,
    messages_json TEXT NOT NULL
);
CREATE INDEX device_federation_outbox_stream_idx ON device_federation_outbox (instance_name, stream_id);
