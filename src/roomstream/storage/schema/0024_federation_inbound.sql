-- Federation, inbound (roomstream.federation.transactions): the transactions other servers
-- sent us with PUT /_matrix/federation/v1/send/{txnId}, and what we answered, so that a
-- retried transaction gets the same answer without being processed again (Synapse's
-- received_transactions). Rows older than a day are pruned by the same module.
CREATE TABLE federation_received_transactions (
    origin TEXT NOT NULL,
    transaction_id TEXT NOT NULL,
    -- The JSON answer sent (``{"pdus": {...}}``).
    response_json TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, transaction_id)
);

CREATE INDEX federation_received_transactions_ts ON federation_received_transactions (received_ts);
