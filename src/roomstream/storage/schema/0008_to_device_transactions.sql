-- Transaction IDs of PUT /sendToDevice, per sending device: a retry with the same one
-- delivers nothing again. Written in the same transaction as the messages it sent
-- (roomstream.client.userdata), so a crash never leaves one without the other.
CREATE TABLE to_device_transactions (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, txn_id)
);
