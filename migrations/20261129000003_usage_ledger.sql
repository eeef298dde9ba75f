-- The usage ledger: append-only byte counts per (account, user, exit, minute),
-- written by the control-api's consumer of the superproxies' usage stream.
-- A batch id can land once only, so a redelivered batch never counts twice.

CREATE TABLE usage_batches (
    batch_id       uuid PRIMARY KEY,
    superproxy_id  uuid NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE usage_ledger (
    id           bigserial PRIMARY KEY,
    batch_id     uuid NOT NULL REFERENCES usage_batches (batch_id),
    account_id   uuid NOT NULL,
    user_id      uuid NOT NULL,
    exit_id      uuid NOT NULL,
    minute       timestamptz NOT NULL,
    -- client -> target
    bytes_up     bigint NOT NULL CHECK (bytes_up >= 0),
    -- target -> client
    bytes_down   bigint NOT NULL CHECK (bytes_down >= 0)
);
CREATE INDEX usage_ledger_account_minute ON usage_ledger (account_id, minute);
CREATE INDEX usage_ledger_user_minute ON usage_ledger (user_id, minute);
