-- FTS5 rows now have their event's stream ordering as rowid (how an event's row is
-- found: roomstream.reading.search.SqliteSearch). Rows written before had any rowid:
-- they are dropped, and the rebuild (every room is listed above) writes them again.
DELETE FROM event_search;
