-- A customer's provenance view asks whether the account's usage through one
-- exit overlaps an observation's span (routes/provenance/exit_view.rs); the
-- (account_id, minute) index would scan every exit's rows of the period.
CREATE INDEX usage_ledger_account_exit_minute ON usage_ledger (account_id, exit_id, minute);
