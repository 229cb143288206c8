-- Accounts and the Client-Server API's own records (roomstream.accounts, roomstream.client).

-- Local users. password_hash is an argon2 hash (NULL: no password login).
CREATE TABLE users (
    user_id TEXT NOT NULL PRIMARY KEY,
    password_hash TEXT,
    admin BOOLEAN NOT NULL DEFAULT FALSE,
    deactivated BOOLEAN NOT NULL DEFAULT FALSE,
    creation_ts BIGINT NOT NULL
);

CREATE TABLE devices (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    display_name TEXT,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- Access tokens are stored only as the SHA-256 of the token (hex).
CREATE TABLE access_tokens (
    token_hash TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX access_tokens_device ON access_tokens (user_id, device_id);

-- Uploaded sync filters: IDs count up per user.
CREATE TABLE user_filters (
    user_id TEXT NOT NULL,
    filter_id BIGINT NOT NULL,
    filter_json TEXT NOT NULL,
    PRIMARY KEY (user_id, filter_id)
);

-- Local room aliases (#alias:server -> room).
CREATE TABLE room_aliases (
    room_alias TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    creator TEXT NOT NULL
);
CREATE INDEX room_aliases_room ON room_aliases (room_id);

-- Rooms a user left and then forgot (no longer listed in their sync).
CREATE TABLE room_forgotten (
    user_id TEXT NOT NULL,
    room_id TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id)
);
