-- The read path (docs/reading.md): what each user may see, decided when events are
-- persisted, in storage that grows with events plus membership changes.

-- One row per event clients may be served in a timeline (not outliers, rejected or
-- soft-failed events), at its position (topological_ordering, stream_ordering), with the
-- class of the room's history visibility in the state before it
-- (0 world_readable, 1 shared, 2 invited, 3 joined).
CREATE TABLE timeline_events (
    room_id TEXT NOT NULL,
    topological_ordering BIGINT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    event_id TEXT NOT NULL,
    instance_name TEXT NOT NULL,
    visibility SMALLINT NOT NULL,
    -- m.room.history_visibility events: the class they set (visible under either).
    visibility_after SMALLINT,
    -- m.room.member events: whose membership, and what it became.
    member_user TEXT,
    membership TEXT,
    -- State events: the event they replaced in the state before them (prev_content).
    replaces_state TEXT,
    PRIMARY KEY (room_id, topological_ordering, stream_ordering)
);
CREATE UNIQUE INDEX timeline_events_event ON timeline_events (event_id);
CREATE INDEX timeline_events_class
    ON timeline_events (room_id, visibility, topological_ordering, stream_ordering);
CREATE INDEX timeline_events_stream ON timeline_events (room_id, stream_ordering);
CREATE INDEX timeline_events_member
    ON timeline_events (member_user, room_id, topological_ordering, stream_ordering)
    WHERE member_user IS NOT NULL;
CREATE INDEX timeline_events_visibility_changes
    ON timeline_events (room_id, topological_ordering, stream_ordering)
    WHERE visibility_after IS NOT NULL;

-- Membership intervals: from the event at this position on, in topological order, up to
-- the next row of the same (room, user), the user's membership in the state before each
-- timeline event is `membership` (NULL: none). Rows appear where that membership differs
-- from the previous timeline event's: one per membership change (more only where forks
-- interleave different memberships), never one per (user, event).
CREATE TABLE visibility_memberships (
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    topological_ordering BIGINT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    membership TEXT,
    PRIMARY KEY (room_id, user_id, topological_ordering, stream_ordering)
);

-- A user's own membership events in any room, newest by stream (invites, kicks, bans...).
CREATE INDEX events_membership_changes ON events (state_key, stream_ordering)
    WHERE type = 'm.room.member';

-- Transaction IDs of events sent through the client API, shown to the sending device.
CREATE TABLE event_txn_ids (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    inserted_ts BIGINT NOT NULL
);
CREATE UNIQUE INDEX event_txn_ids_txn ON event_txn_ids (room_id, user_id, device_id, txn_id);
