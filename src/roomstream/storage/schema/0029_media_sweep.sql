-- The orphan media sweep (roomstream.media.repository.MediaRepository.sweep): which blobs
-- some row still names, and which asynchronous-upload reservations expired unused.

-- "Is this content referenced?": one index seek per candidate blob, media and thumbnails.
CREATE INDEX media_content_hash ON media (content_hash);
CREATE INDEX media_thumbnails_content_hash ON media_thumbnails (content_hash);
-- Pending reservations (no upload yet) by age: the sweep deletes the expired ones.
CREATE INDEX media_pending_created ON media (created_ts) WHERE upload_ts IS NULL;
