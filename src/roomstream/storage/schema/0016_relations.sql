-- Relations (m.relates_to: threads, edits, reactions, references), recorded by the
-- persister's transaction for every timeline event that relates to another
-- (roomstream.reading.relations). Reads join timeline_events for visibility.

-- One row per timeline event with a well-formed m.relates_to (a string rel_type and a
-- string event_id), at the event's own position in the room's topological order.
CREATE TABLE event_relations (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    relates_to_id TEXT NOT NULL,
    relation_type TEXT NOT NULL,
    -- m.annotation: its key (the reaction); else NULL.
    aggregation_key TEXT,
    event_type TEXT NOT NULL,
    sender TEXT NOT NULL,
    topological_ordering BIGINT NOT NULL,
    stream_ordering BIGINT NOT NULL
);
CREATE INDEX event_relations_parent
    ON event_relations (relates_to_id, relation_type, topological_ordering, stream_ordering);

-- One row per thread root: the position of its latest m.thread relation (the order of
-- GET /rooms/{id}/threads). Only ever moves forward.
CREATE TABLE threads (
    room_id TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    latest_event_id TEXT NOT NULL,
    topological_ordering BIGINT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (room_id, thread_id)
);
CREATE INDEX threads_latest ON threads (room_id, topological_ordering, stream_ordering);
