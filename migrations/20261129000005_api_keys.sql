-- API keys: operator keys (account_id NULL) see everything; account keys see
-- only their own account. Only the SHA-256 of a key is stored.
CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    account_id   uuid REFERENCES accounts (id),
    name         text NOT NULL DEFAULT '',
    key_sha256   text NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX api_keys_account ON api_keys (account_id);
