-- A user policy the operator wrote binds the account, as the account's own
-- policy does (20261204000005): the account's key can no longer replace or
-- clear it, nor shed it by deleting the user; the operator clears it with `{}`.
ALTER TABLE proxy_users ADD COLUMN policy_by_operator boolean NOT NULL DEFAULT false;
