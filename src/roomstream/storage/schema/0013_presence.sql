-- The presence stream (roomstream.client.presence_store): each user's latest presence,
-- one row per user (older rows are deleted as a newer one is written, as in Synapse's
-- presence_stream), so it is both the stream and the current state.
CREATE TABLE presence_stream (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL,
    state TEXT NOT NULL,
    last_active_ts BIGINT NOT NULL,
    last_federation_update_ts BIGINT NOT NULL,
    last_user_sync_ts BIGINT NOT NULL,
    status_msg TEXT,
    currently_active BOOLEAN NOT NULL
);
CREATE INDEX presence_stream_idx ON presence_stream (instance_name, stream_id);
CREATE INDEX presence_stream_id ON presence_stream (stream_id);
CREATE INDEX presence_stream_user_id ON presence_stream (user_id);
