-- Client IPs seen per device (GET /admin/whois) and OpenID tokens (issue 17 §7).

-- The last time each (device, IP) made an authenticated request, and its user agent then;
-- written in batches by roomstream.accounts.client_ips (at most once a minute per key).
CREATE TABLE user_ips (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    ip TEXT NOT NULL,
    user_agent TEXT NOT NULL,
    last_seen BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, ip)
);

-- OpenID tokens (POST /user/{id}/openid/request_token), only as their SHA-256 (hex),
-- valid until expires_ts (ms).
CREATE TABLE openid_tokens (
    token_hash TEXT NOT NULL PRIMARY KEY,
    user_id TEXT NOT NULL,
    expires_ts BIGINT NOT NULL
);
CREATE INDEX openid_tokens_expiry ON openid_tokens (expires_ts);
