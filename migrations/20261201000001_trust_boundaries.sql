-- Trust boundaries between the operator and the accounts it sells to.

-- Entitlements: what an operator grants an account (limits that bound the
-- account as a whole and every user's own, targeting restrictions, which
-- source types it may route, how wide its allow-listed networks may be).
-- An account's own keys may narrow within them, never widen.
ALTER TABLE accounts ADD COLUMN entitlements jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(entitlements) = 'object');
-- A deleted account keeps its ledger and audit trail; its users are disabled.
ALTER TABLE accounts ADD COLUMN deleted_at timestamptz;

-- Ceilings: the limits an operator last set on a user. The account's keys
-- may lower the user's limits below them, not raise or remove them.
ALTER TABLE proxy_users ADD COLUMN ceilings jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(ceilings) = 'object');

-- Key lineage: the key that minted a key (NULL: the bootstrap admin token);
-- revoking a key revokes everything it minted, transitively.
ALTER TABLE api_keys ADD COLUMN minted_by uuid REFERENCES api_keys (id);
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;
CREATE INDEX api_keys_minted_by ON api_keys (minted_by);

-- Money is fixed when bytes move: each ledger row carries the exit's source
-- type and the plan and price in force when it was recorded, and invoices
-- are computed from these columns only. Existing rows get what the database
-- knows now (their exits' type, their account's plan): the best record there is.
ALTER TABLE usage_ledger ADD COLUMN source_type text;
ALTER TABLE usage_ledger ADD COLUMN plan_id uuid;
ALTER TABLE usage_ledger ADD COLUMN cents_per_gb bigint;
UPDATE usage_ledger l SET source_type = e.source_type FROM exits e WHERE e.id = l.exit_id;
UPDATE usage_ledger l SET plan_id = a.plan_id FROM accounts a WHERE a.id = l.account_id;
UPDATE usage_ledger l SET cents_per_gb = p.cents_per_gb
  FROM plan_prices p WHERE p.plan_id = l.plan_id AND p.source_type = l.source_type;
