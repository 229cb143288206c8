-- Room events: exact JSON, the DAG, rooms, redactions, and state (see docs/state.md).

CREATE TABLE rooms (
    room_id TEXT NOT NULL PRIMARY KEY,
    room_version TEXT NOT NULL,
    creator TEXT NOT NULL,
    is_public BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE TABLE event_edges (
    event_id TEXT NOT NULL,
    prev_event_id TEXT NOT NULL,
    PRIMARY KEY (event_id, prev_event_id)
);
CREATE INDEX event_edges_prev ON event_edges (prev_event_id);

CREATE TABLE event_auth (
    event_id TEXT NOT NULL,
    auth_id TEXT NOT NULL,
    PRIMARY KEY (event_id, auth_id)
);

-- Events in a room that no other known event names as a prev event.
CREATE TABLE event_forward_extremities (
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (room_id, event_id)
);

-- Redactions: redacts may name an event not yet seen; it is applied when that arrives.
CREATE TABLE redactions (
    event_id TEXT NOT NULL PRIMARY KEY,
    redacts TEXT NOT NULL
);
CREATE INDEX redactions_redacts ON redactions (redacts);

-- Chain cover index over auth chains (docs/state_resolution.md).
CREATE TABLE event_auth_chains (
    event_id TEXT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    chain_id BIGINT NOT NULL,
    sequence_number BIGINT NOT NULL
);
CREATE INDEX event_auth_chains_room ON event_auth_chains (room_id);
CREATE TABLE event_auth_chain_links (
    room_id TEXT NOT NULL,
    origin_chain_id BIGINT NOT NULL,
    origin_sequence_number BIGINT NOT NULL,
    target_chain_id BIGINT NOT NULL,
    target_sequence_number BIGINT NOT NULL
);
CREATE INDEX event_auth_chain_links_room ON event_auth_chain_links (room_id);

-- State: branches of versioned entries. A state group is a version (branch, seq) of one
-- branch; an entry holds one (type, state_key) -> event_id for seqs [from_seq, to_seq).
-- A branch may start from a version of another branch (its base) after a fork.
CREATE TABLE state_branches (
    branch_id BIGINT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    base_branch_id BIGINT,
    base_seq BIGINT,
    depth INTEGER NOT NULL,
    tip_seq BIGINT NOT NULL,
    live_rows BIGINT NOT NULL DEFAULT 0,
    closed_rows BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE state_groups (
    state_group BIGINT NOT NULL PRIMARY KEY,
    room_id TEXT NOT NULL,
    branch_id BIGINT NOT NULL,
    seq BIGINT NOT NULL
);
CREATE UNIQUE INDEX state_groups_version ON state_groups (branch_id, seq);
CREATE TABLE state_entries (
    branch_id BIGINT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT,
    from_seq BIGINT NOT NULL,
    to_seq BIGINT NOT NULL
);
CREATE INDEX state_entries_key ON state_entries (branch_id, type, state_key, from_seq);
-- Covering, so a full read never touches the table.
CREATE INDEX state_entries_alive ON state_entries
    (branch_id, to_seq, from_seq, type, state_key, event_id);

-- The state before and after each (non-outlier) event.
CREATE TABLE event_state (
    event_id TEXT NOT NULL PRIMARY KEY,
    before_group BIGINT NOT NULL,
    after_group BIGINT NOT NULL
);

CREATE TABLE current_state_events (
    room_id TEXT NOT NULL,
    type TEXT NOT NULL,
    state_key TEXT NOT NULL,
    event_id TEXT NOT NULL,
    membership TEXT,
    PRIMARY KEY (room_id, type, state_key)
);
CREATE INDEX current_state_members ON current_state_events (state_key, type, membership);
