-- Verify keys of other servers that received events may be signed with. Until roomstream
-- fetches keys over federation, an operator adds them (``roomstream keys add``); the
-- local server's own key is known from its key file and never stored here.
CREATE TABLE server_verify_keys (
    server_name TEXT NOT NULL,
    -- "ed25519:<version>", as in an event's signatures
    key_id TEXT NOT NULL,
    -- the ed25519 public key, unpadded standard base64 (as in /_matrix/key/v2/server)
    verify_key TEXT NOT NULL,
    added_ts BIGINT NOT NULL,
    PRIMARY KEY (server_name, key_id)
);
