-- An account policy the operator wrote binds the account: its own key can
-- no longer replace it (until the operator clears it with `{}`).
ALTER TABLE accounts ADD COLUMN policy_by_operator boolean NOT NULL DEFAULT false;
