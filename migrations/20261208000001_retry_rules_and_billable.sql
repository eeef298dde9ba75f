-- Ban rules (docs/policy.md, "Retry rules"): a list of
-- {sites, statuses, header, retry, cool} on accounts and users, validated
-- and normalised by the control-api (store/src/policy.rs) and projected into
-- every user record. The operator's own rules live in operator_policy.body
-- and need no column.
ALTER TABLE accounts ADD COLUMN retry_rules jsonb NOT NULL DEFAULT '[]';
ALTER TABLE proxy_users ADD COLUMN retry_rules jsonb NOT NULL DEFAULT '[]';

-- Bytes of an attempt the gateway gave up on (a ban it retried through
-- another exit) are recorded but not billed: invoices leave them out, the
-- usage API shows them apart (docs/usage.md). Every row before this one was
-- billed.
ALTER TABLE usage_ledger ADD COLUMN billable boolean NOT NULL DEFAULT true;
