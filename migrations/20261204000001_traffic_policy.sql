-- Traffic policy by target domain (docs/policy.md).
--
-- A customer's rules on its account (bounding every user) and on each user
-- (narrowing the account's): allowed/denied domains and per-domain limits,
-- stored normalised as the API returns them.
ALTER TABLE accounts ADD COLUMN policy jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE proxy_users ADD COLUMN policy jsonb NOT NULL DEFAULT '{}'::jsonb;

-- The operator's rules for every account: one row, replaced whole by
-- PUT /v1/policy and projected to Redis for every superproxy.
CREATE TABLE operator_policy (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    body       jsonb NOT NULL,
    version    bigint NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now()
);
