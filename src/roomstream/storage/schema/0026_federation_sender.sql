-- The federation sender (roomstream.federation.sender; docs/federation/sender.md).

-- How far each sender instance has processed each stream it consumes (type: the stream's
-- name, e.g. 'events', 'receipts'). Stored after what it read is queued and, for events,
-- after the destination_rooms rows of those events: a restart resumes from here.
CREATE TABLE federation_stream_position (
    type TEXT NOT NULL,
    instance_name TEXT NOT NULL,
    stream_id BIGINT NOT NULL,
    PRIMARY KEY (type, instance_name)
);

-- Each remote server the sender has had something for: its back-off (times in ms;
-- failure_ts NULL: not failing; retry_interval 0: no back-off) and the stream ordering of
-- the newest PDU it accepted (NULL: none yet). A destination with a destination_rooms
-- row newer than last_successful_stream_ordering has missed events (catch-up).
CREATE TABLE destinations (
    destination TEXT NOT NULL PRIMARY KEY,
    failure_ts BIGINT,
    retry_last_ts BIGINT NOT NULL DEFAULT 0,
    retry_interval BIGINT NOT NULL DEFAULT 0,
    last_successful_stream_ordering BIGINT
);

-- Per (destination, room): the stream ordering of the newest local event sent (or due to
-- be sent) to the destination in that room. Catch-up sends each room's newest event past
-- the destination's last_successful_stream_ordering.
CREATE TABLE destination_rooms (
    destination TEXT NOT NULL,
    room_id TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (destination, room_id)
);
CREATE INDEX destination_rooms_stream ON destination_rooms (destination, stream_ordering);
