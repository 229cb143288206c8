-- Issue 21 §4: reports of events and rooms (stored for the server's admins), and the
-- index GET /rooms/{id}/timestamp_to_event walks (a room's events by their timestamp).

-- POST /rooms/{id}/report/{eventId}: one row per report (a user may report an event
-- more than once, as Synapse keeps them).
CREATE TABLE event_reports (
    report_id TEXT NOT NULL PRIMARY KEY,
    received_ts BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    reason TEXT,
    score BIGINT
);
CREATE INDEX event_reports_received ON event_reports (received_ts);

-- POST /rooms/{id}/report: one row per report.
CREATE TABLE room_reports (
    report_id TEXT NOT NULL PRIMARY KEY,
    received_ts BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX room_reports_received ON room_reports (received_ts);

CREATE INDEX events_room_timestamp ON events (room_id, origin_server_ts, stream_ordering);
