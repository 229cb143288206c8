-- One number per sender start: transaction IDs are "<epoch>.<counter>", unique for the
-- origin across restarts and across sender instances.
INSERT INTO roomstream_sequences (name, last_value) VALUES ('federation_txn_epoch_seq', 0);
