-- Rooms whose relations index (0016: event_relations, threads) and search index (0017:
-- event_search) may lack some of their events: those persisted before 0016/0017, and
-- those a bulk import loaded. The read side indexes them from the stored events
-- (roomstream.reading.index_backfill), `done_through` (a stream ordering) saying how
-- far, and removes each room from here when it is complete. Which events predate
-- 0016/0017 is recorded nowhere, so every room with timeline events is listed: the
-- rebuild skips what is indexed already (a new database gets no row).
CREATE TABLE index_backfill_rooms (
    room_id TEXT NOT NULL PRIMARY KEY,
    done_through BIGINT
);
INSERT INTO index_backfill_rooms (room_id)
SELECT DISTINCT e.room_id FROM events e
WHERE NOT e.outlier AND NOT e.soft_failed AND e.rejected_reason IS NULL;
