-- Local users' global profiles (roomstream.accounts.profiles): the display name and avatar
-- the profile API serves and that new membership events of the user carry. One row per
-- local user, created with the user (display name: the localpart, as Synapse does); NULL
-- is unset.
CREATE TABLE profiles (
    user_id TEXT NOT NULL PRIMARY KEY,
    displayname TEXT,
    avatar_url TEXT
);

-- Users registered before profiles existed get a row too (with nothing set), so that a
-- profile exists exactly for the users that exist.
INSERT INTO profiles (user_id) SELECT user_id FROM users;
