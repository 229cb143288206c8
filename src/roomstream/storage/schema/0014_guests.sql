-- Guest accounts (roomstream.accounts): POST /register?kind=guest makes a user with
-- is_guest set; upgrading it to a full account (POST /register with guest_access_token)
-- clears the flag and records when (upgrade_ts, ms). A deactivated user keeps its row
-- (deactivated, no password hash) so that its ID is never given out again.
ALTER TABLE users ADD COLUMN is_guest BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE users ADD COLUMN upgrade_ts BIGINT;
