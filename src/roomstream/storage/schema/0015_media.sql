-- The media repository (roomstream.media): what each media ID is, and the thumbnails made
-- of it. Content lives in the blob store (files on disk by default), addressed by the
-- SHA-256 of its bytes: identical content is one file, however many media IDs name it.

-- One row per local media ID. A row with upload_ts NULL is a pending asynchronous upload
-- (POST /_matrix/media/v1/create): no content yet, and none of the content columns set.
CREATE TABLE media (
    media_id TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    upload_ts BIGINT,
    media_type TEXT,
    upload_name TEXT,
    media_length BIGINT,
    content_hash TEXT,
    -- An image's dimensions, read from its header at upload (NULL: not an image we read).
    width INTEGER,
    height INTEGER,
    -- An image of several frames (a static thumbnail unless animated=true is asked for).
    animated BOOLEAN NOT NULL,
    -- Uploaded while authenticated media was on: the legacy unauthenticated endpoints
    -- answer 404 for it (Synapse's "freeze").
    authenticated BOOLEAN NOT NULL
);
-- The upload quota: bytes a user uploaded since a time.
CREATE INDEX media_user_uploads ON media (user_id, upload_ts);

-- Thumbnails, one per (media, method, size, animated): the size is the thumbnail's own,
-- never above the original's (no upscaling).
CREATE TABLE media_thumbnails (
    media_id TEXT NOT NULL,
    method TEXT NOT NULL,
    width INTEGER NOT NULL,
    height INTEGER NOT NULL,
    animated BOOLEAN NOT NULL,
    media_type TEXT NOT NULL,
    media_length BIGINT NOT NULL,
    content_hash TEXT NOT NULL,
    PRIMARY KEY (media_id, method, width, height, animated)
);
