CREATE TABLE event_json (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    room_version TEXT NOT NULL,
    json BYTEA NOT NULL
);
ALTER TABLE events ADD COLUMN redacted_by TEXT;
CREATE SEQUENCE state_group_id_seq;
CREATE SEQUENCE state_branch_id_seq;
