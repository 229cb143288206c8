-- One number per sender start: transaction IDs are "<epoch>.<counter>", unique for the
-- origin across restarts and across sender instances.
CREATE SEQUENCE federation_txn_epoch_seq;
