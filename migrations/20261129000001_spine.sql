-- The spine: accounts, proxy users, exits and their enrollment, the audit log.

CREATE TABLE accounts (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE proxy_users (
    id             uuid PRIMARY KEY,
    account_id     uuid NOT NULL REFERENCES accounts (id),
    -- Base usernames never contain '-': the username grammar uses it to separate keys.
    username       text NOT NULL CHECK (username ~ '^[A-Za-z0-9_.]{1,64}$'),
    -- argon2id PHC string; the password itself is never stored.
    password_hash  text NOT NULL,
    enabled        boolean NOT NULL DEFAULT true,
    -- Bumped on every change so data-plane caches can tell stale from current.
    version        bigint NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    -- Users are soft-deleted so usage rows keep pointing at something.
    deleted_at     timestamptz
);
CREATE UNIQUE INDEX proxy_users_live_username ON proxy_users (username) WHERE deleted_at IS NULL;
CREATE INDEX proxy_users_account ON proxy_users (account_id);

CREATE TABLE exits (
    id                 uuid PRIMARY KEY,
    name               text NOT NULL,
    source_type        text NOT NULL CHECK (source_type IN ('dc', 'isp', 'res', 'mobile')),
    owner              text NOT NULL,
    country            text NOT NULL CHECK (country ~ '^[A-Z]{2}$'),
    egress_ips         text[] NOT NULL CHECK (cardinality(egress_ips) BETWEEN 1 AND 256),
    -- SHA-256 of the agent's 256-bit random credential (machine secret, not a password).
    credential_sha256  text NOT NULL,
    hostname           text NOT NULL DEFAULT '',
    agent_version      text NOT NULL DEFAULT '',
    draining           boolean NOT NULL DEFAULT false,
    disabled           boolean NOT NULL DEFAULT false,
    enrolled_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz
);

CREATE TABLE enrollment_tokens (
    id            uuid PRIMARY KEY,
    token_sha256  text NOT NULL UNIQUE,
    name          text NOT NULL,
    source_type   text NOT NULL CHECK (source_type IN ('dc', 'isp', 'res', 'mobile')),
    owner         text NOT NULL,
    country       text NOT NULL CHECK (country ~ '^[A-Z]{2}$'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    used_at       timestamptz,
    exit_id       uuid REFERENCES exits (id)
);

CREATE TABLE audit_log (
    id       bigserial PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL,
    subject  text NOT NULL,
    detail   jsonb NOT NULL DEFAULT '{}'::jsonb
);
