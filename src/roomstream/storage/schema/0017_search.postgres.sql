-- `vector` is to_tsvector('english', value), written with the row; GIN-indexed.
CREATE TABLE event_search (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    key TEXT NOT NULL,
    vector TSVECTOR NOT NULL
);
CREATE INDEX event_search_vector ON event_search USING GIN (vector);
