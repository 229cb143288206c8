-- Rooms whose visibility records (0005: timeline_events, visibility_memberships) lack
-- some of their events: those persisted before 0005 existed. The read side rebuilds them
-- (roomstream.reading.backfill) and removes each room from here when it is complete.
-- Filled once, here: a database that is new, or whose events were all persisted with
-- 0005 in force, gets no row.
CREATE TABLE visibility_backfill_rooms (
    room_id TEXT NOT NULL PRIMARY KEY
);
INSERT INTO visibility_backfill_rooms (room_id)
SELECT DISTINCT e.room_id FROM events e
WHERE NOT e.outlier AND NOT e.soft_failed AND e.rejected_reason IS NULL
    AND NOT EXISTS (SELECT 1 FROM timeline_events t WHERE t.event_id = e.event_id);
