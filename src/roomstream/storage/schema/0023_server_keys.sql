-- Keys fetched over federation join the operator-added ones (0004) in one store
-- (roomstream.rooms.keys.ServerKeyStore), with the validity their server gave them:
-- `valid_until_ts` is a current key's `valid_until_ts`, or an old key's `expired_ts`
-- (an old key verifies only what was signed before it expired); NULL (keys added by an
-- operator or an import's keys file) means no limit. `fetched_from` is the server that
-- answered (the key's own server, or a notary); NULL: added by an operator.
ALTER TABLE server_verify_keys ADD COLUMN valid_until_ts BIGINT;
ALTER TABLE server_verify_keys ADD COLUMN fetched_from TEXT;
-- The latest self-signed /_matrix/key/v2/server answer of each remote server, exactly as
-- it signed it (a notary serves it again with its own signature added).
CREATE TABLE server_key_responses (
    server_name TEXT NOT NULL PRIMARY KEY,
    response TEXT NOT NULL,
    valid_until_ts BIGINT NOT NULL,
    fetched_ts BIGINT NOT NULL
);
