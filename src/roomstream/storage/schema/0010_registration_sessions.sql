-- User-interactive-auth sessions that completed a registration (roomstream.accounts): a
-- retry through the same session answers with that registration's user again, as
-- Synapse does, instead of M_USER_IN_USE. One row per registration, so it grows no
-- faster than users do.
CREATE TABLE registration_sessions (
    session_id TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
