-- End-to-end encryption's server side (roomstream.e2e): device keys, one-time and fallback
-- keys, cross-signing keys and signatures, server-side key backup, and the device_lists
-- stream. The server never sees plaintext: every *_json column is a client's signed JSON.

-- device_lists stream: one row per (fact, user) whose devices or keys changed.
CREATE TABLE device_lists_stream (
    stream_id BIGINT NOT NULL,
    instance_name TEXT NOT NULL,
    user_id TEXT NOT NULL
);
CREATE INDEX device_lists_stream_idx ON device_lists_stream (instance_name, stream_id);
CREATE INDEX device_lists_stream_id ON device_lists_stream (stream_id);

-- A device's identity keys as uploaded (signed by the device); written once per device.
CREATE TABLE e2e_device_keys (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- One-time keys: each is handed out once (POST /keys/claim deletes it).
CREATE TABLE e2e_one_time_keys (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id, algorithm, key_id)
);

-- The one fallback key per (device, algorithm); `used` once claimed (it stays).
CREATE TABLE e2e_fallback_keys (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id TEXT NOT NULL,
    key_json TEXT NOT NULL,
    used BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (user_id, device_id, algorithm)
);

-- Cross-signing keys: key_type is master, self_signing or user_signing (latest only).
CREATE TABLE e2e_cross_signing_keys (
    user_id TEXT NOT NULL,
    key_type TEXT NOT NULL,
    public_key TEXT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, key_type)
);

-- Signatures uploaded through POST /keys/signatures/upload: signer (user, key ID) over the
-- target's key (a device ID or a cross-signing public key).
CREATE TABLE e2e_signatures (
    signer_user_id TEXT NOT NULL,
    signer_key_id TEXT NOT NULL,
    target_user_id TEXT NOT NULL,
    target_key_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    PRIMARY KEY (target_user_id, target_key_id, signer_user_id, signer_key_id)
);

-- Server-side key backup: versions per user (the highest not deleted is current).
CREATE TABLE e2e_room_keys_versions (
    user_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    algorithm TEXT NOT NULL,
    auth_data TEXT NOT NULL,
    etag BIGINT NOT NULL DEFAULT 0,
    deleted BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (user_id, version)
);

CREATE TABLE e2e_room_keys (
    user_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    first_message_index BIGINT NOT NULL,
    forwarded_count BIGINT NOT NULL,
    is_verified BOOLEAN NOT NULL,
    session_data TEXT NOT NULL,
    PRIMARY KEY (user_id, version, room_id, session_id)
);
