-- Unread counts per thread (roomstream.client.unread): the relation events of a room by
-- position, so the events of threads read less far than the main timeline are found
-- without reading the room's main-timeline events between the two receipts.
CREATE INDEX event_relations_room_stream ON event_relations (room_id, stream_ordering);
