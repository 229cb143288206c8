-- Remote users' devices as their servers' m.device_list_update and m.signing_key_update
-- EDUs describe them (roomstream.federation.remote_devices; Synapse's
-- device_lists_remote_cache / _extremeties / _resync and e2e_cross_signing_keys of
-- remote users).

-- One row per remote user whose device list this server tracks: the last stream_id of
-- theirs applied, and whether what is cached is known to be incomplete (an update whose
-- prev_id we had not seen, or a deletion of everything): then the cache is not to be
-- trusted until a resync (GET /user/devices) replaces it.
CREATE TABLE federation_remote_device_lists (
    user_id TEXT NOT NULL PRIMARY KEY,
    stream_id BIGINT NOT NULL,
    stale SMALLINT NOT NULL,
    updated_ts BIGINT NOT NULL
);

-- The remote user's devices as the updates gave them (keys: the signed device keys
-- JSON, or NULL when an update named the device without keys).
CREATE TABLE federation_remote_devices (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    keys_json TEXT,
    PRIMARY KEY (user_id, device_id)
);

-- The remote user's cross-signing keys (master, self_signing) from m.signing_key_update
-- (or a /user/devices answer), one row per kind.
CREATE TABLE federation_remote_cross_signing (
    user_id TEXT NOT NULL,
    key_type TEXT NOT NULL,
    key_json TEXT NOT NULL,
    PRIMARY KEY (user_id, key_type)
);
