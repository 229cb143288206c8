-- FTS5: `value` is indexed (unicode61 with diacritics folded, porter stemming); the
-- other columns are carried for the join with timeline_events and the `keys` filter.
CREATE VIRTUAL TABLE event_search USING fts5(
    value,
    event_id UNINDEXED,
    room_id UNINDEXED,
    key UNINDEXED,
    tokenize = 'porter unicode61 remove_diacritics 2'
);
