CREATE TABLE event_json (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    room_version TEXT NOT NULL,
    json BLOB NOT NULL
);
ALTER TABLE events ADD COLUMN redacted_by TEXT;
INSERT INTO roomstream_sequences (name, last_value) VALUES ('state_group_id_seq', 0);
INSERT INTO roomstream_sequences (name, last_value) VALUES ('state_branch_id_seq', 0);
