-- Signed webhooks (docs/webhooks.md): subscriptions, the delivery outbox,
-- and what the quota events need to fire once per owner and period.

-- A subscription. account_id NULL: an operator webhook (every account's
-- events, and the operator-only exit events).
CREATE TABLE webhooks (
    id          uuid PRIMARY KEY,
    account_id  uuid REFERENCES accounts (id),
    url         text NOT NULL CHECK (octet_length(url) <= 2048),
    events      text[] NOT NULL CHECK (cardinality(events) > 0),
    -- The HMAC-SHA256 signing key, shown once when the webhook is made. The
    -- server must sign with it, so it is kept as is (unlike a password or an
    -- API key, of which only a hash is stored); it never leaves the server
    -- again and goes when the webhook goes.
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhooks_account ON webhooks (account_id);

-- The outbox: one row per (event, subscribed webhook), inserted in the
-- transaction of the change that caused the event, sent by any control-api
-- (claimed with FOR UPDATE SKIP LOCKED; next_attempt_at doubles as the lease
-- of a claimed row).
CREATE TABLE webhook_deliveries (
    -- Proxynet-Delivery: the same on every attempt.
    id               uuid PRIMARY KEY,
    webhook_id       uuid NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    -- The body's `id`: the same for every webhook the event went to.
    event_id         uuid NOT NULL,
    event            text NOT NULL,
    -- The exact bytes sent (and signed) on every attempt.
    body             text NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status_code integer,
    last_error       text,
    -- At most a short snippet of the receiver's last answer.
    last_response    text CHECK (octet_length(last_response) <= 1024),
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_history ON webhook_deliveries (webhook_id, created_at DESC, id DESC);

-- Bytes per quota owner and quota window, kept by the ledger writer in the
-- transaction that records each usage batch (so a crossing is seen in O(1)
-- per batch, not by summing the ledger). owner_kind 'user' or 'account'.
CREATE TABLE quota_usage (
    owner_kind    text NOT NULL CHECK (owner_kind IN ('user', 'account')),
    owner_id      uuid NOT NULL,
    window_start  timestamptz NOT NULL,
    used_bytes    bigint NOT NULL CHECK (used_bytes >= 0),
    PRIMARY KEY (owner_kind, owner_id, window_start)
);

-- Which quota events were emitted: each at most once per owner and window.
CREATE TABLE quota_notices (
    owner_kind    text NOT NULL CHECK (owner_kind IN ('user', 'account')),
    owner_id      uuid NOT NULL,
    window_start  timestamptz NOT NULL,
    event         text NOT NULL CHECK (event IN ('quota.warning', 'quota.exhausted')),
    limit_bytes   bigint NOT NULL,
    used_bytes    bigint NOT NULL,
    emitted_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_kind, owner_id, window_start, event)
);
