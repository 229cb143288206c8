-- Media in the Spark views (roomstream.pipelines.views): uploads per user and per UTC day.
--
-- Uploads are not on a stream (the media repository writes its `media` rows with no
-- stream position), so this view is a batch derivation from the `media` table, not a
-- fold over stream facts: the views sink recomputes the recent days' rows from `media`
-- inside each micro-batch's transaction, and a rebuild recomputes every day
-- (docs/pipelines.md, "Media statistics").

-- One row per (uploader, UTC day of upload_ts) with at least one completed upload
-- (pending asynchronous uploads have no content yet and are not counted).
-- content_types: a JSON object {media type (lower case, without parameters): uploads},
-- keys sorted; its values add up to `uploads`.
CREATE TABLE view_media_stats (
    user_id TEXT NOT NULL,
    day TEXT NOT NULL,
    uploads BIGINT NOT NULL,
    bytes BIGINT NOT NULL,
    content_types TEXT NOT NULL,
    PRIMARY KEY (user_id, day)
);

-- The refresh reads `media` by upload time across users (the repository's own index is
-- per user): without this, every micro-batch's refresh would scan the whole table.
CREATE INDEX media_upload_ts ON media (upload_ts);
