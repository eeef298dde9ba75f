-- Upstream exits: an exit whose agent opens every tunnel through a partner's
-- backconnect gateway. What the control plane keeps of it: the gateway's
-- scheme, host and port (never its credentials, which stay on the agent's
-- host), the countries the partner serves through it and which of our
-- targeting keys its username template carries.
ALTER TABLE exits ADD COLUMN upstream jsonb;

-- What the source costs per GB (both directions) as its supplier bills it:
-- a margin per plan, and the reconciliation view's cost column.
ALTER TABLE sources ADD COLUMN cost_cents_per_gb bigint CHECK (cost_cents_per_gb >= 0);
