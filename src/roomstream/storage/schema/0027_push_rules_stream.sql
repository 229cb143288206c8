-- Push rules on a stream of their own (roomstream.client.push_store), as Synapse's
-- push_rules stream: each user's rules document, written by the push_rules stream's one
-- writer; a row's stream_id moves on every change of the user's rules, and the stream's
-- row is the user (every process forgets its cached rules for them).
CREATE TABLE push_rules (
    user_id TEXT NOT NULL PRIMARY KEY,
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    -- The whole document {"global": {kind: [rule, ...]}} (JSON), defaults included.
    rules TEXT NOT NULL
);
CREATE INDEX push_rules_stream ON push_rules (instance_name, stream_id);

-- Rules stored before this stream existed were the users' m.push_rules account data:
-- they move here (stream position 0: before every token, nothing to replicate). The
-- account data stays, as the copy clients see in /sync.
INSERT INTO push_rules (user_id, stream_id, instance_name, rules)
SELECT user_id, 0, 'main', content FROM account_data
WHERE account_data_type = 'm.push_rules';

-- The device that set a pusher (POST /pushers/set): deleting the device (a logout)
-- removes its pushers, as Synapse does. NULL: set before this column existed.
ALTER TABLE pushers ADD COLUMN device_id TEXT;
-- The time (ms) of the pusher's last POST /pushers/set, sent to the gateway (in
-- seconds) as the device's pushkey_ts.
ALTER TABLE pushers RENAME COLUMN created_ts TO pushkey_ts;
