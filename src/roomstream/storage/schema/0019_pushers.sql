-- Pushers (roomstream.client.pushers): where each user's notifications are pushed, and
-- how far each pusher has delivered. The pushers stream (as Synapse's) is these rows and
-- deleted_pushers: a row's stream_id moves on every change.

-- One row per (app_id, pushkey, user_id), as the spec keys a pusher.
CREATE TABLE pushers (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    pushkey TEXT NOT NULL,
    kind TEXT NOT NULL,
    app_display_name TEXT NOT NULL,
    device_display_name TEXT NOT NULL,
    profile_tag TEXT,
    lang TEXT NOT NULL,
    -- The pusher's data object (JSON), url included.
    data TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    -- Every notifying event at or below this events-stream position was delivered (or
    -- given up on): delivery continues above it, also after a restart.
    last_stream_ordering BIGINT NOT NULL,
    last_success_ts BIGINT,
    -- Since when deliveries fail (NULL: the last one succeeded).
    failing_since BIGINT,
    PRIMARY KEY (app_id, pushkey, user_id)
);
CREATE INDEX pushers_stream ON pushers (instance_name, stream_id);
CREATE INDEX pushers_user ON pushers (user_id);

-- Pushers removed (the stream's deletion rows).
CREATE TABLE deleted_pushers (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    app_id TEXT NOT NULL,
    pushkey TEXT NOT NULL
);
CREATE INDEX deleted_pushers_stream ON deleted_pushers (instance_name, stream_id);
