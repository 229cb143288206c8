-- Tables written by the Spark pipelines (roomstream.pipelines): derived views over the
-- events stream, and the batch bookkeeping that makes their sinks exactly-once.

-- One row per (sink, micro-batch) a database sink has applied. Written in the same
-- transaction as the batch's data, so a replayed batch finds its row and changes nothing.
CREATE TABLE pipeline_batches (
    sink_name TEXT NOT NULL,
    batch_id BIGINT NOT NULL,
    rows_written BIGINT NOT NULL,
    committed_ts BIGINT NOT NULL,
    PRIMARY KEY (sink_name, batch_id)
);

-- The views' own copy of rooms' current state (one row per state key), kept so that a
-- change can be turned into count deltas. membership / display_name / join_rule are set
-- for m.room.member / m.room.join_rules entries only.
CREATE TABLE view_room_state (
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    membership TEXT,
    display_name TEXT,
    join_rule TEXT,
    PRIMARY KEY (room_id, type, state_key)
);
CREATE INDEX view_room_state_member_idx ON view_room_state (state_key, type);

-- Room statistics: current membership counts, current state size, last activity.
CREATE TABLE view_room_stats (
    room_id TEXT NOT NULL PRIMARY KEY,
    joined_members BIGINT NOT NULL DEFAULT 0,
    invited_members BIGINT NOT NULL DEFAULT 0,
    left_members BIGINT NOT NULL DEFAULT 0,
    banned_members BIGINT NOT NULL DEFAULT 0,
    current_state_events BIGINT NOT NULL DEFAULT 0,
    is_public BOOLEAN NOT NULL DEFAULT FALSE,
    last_activity_ts BIGINT
);

-- m.room.message events per room per UTC day (day = 'YYYY-MM-DD' of origin_server_ts).
CREATE TABLE view_room_daily_messages (
    room_id TEXT NOT NULL,
    day TEXT NOT NULL,
    messages BIGINT NOT NULL,
    PRIMARY KEY (room_id, day)
);

-- User statistics: rooms currently joined, events sent.
CREATE TABLE view_user_stats (
    user_id TEXT NOT NULL PRIMARY KEY,
    rooms_joined BIGINT NOT NULL DEFAULT 0,
    events_sent BIGINT NOT NULL DEFAULT 0
);

-- User directory: users joined to a public room or sharing a joined room with someone.
CREATE TABLE view_user_directory (
    user_id TEXT NOT NULL PRIMARY KEY,
    display_name TEXT
);
