-- Usage by target domain and exit country (GET /v1/accounts/{id}/usage?group_by=).
--
-- Each ledger row gains the target's registrable domain (from the
-- superproxy) and the exit's country (from the exit at ingestion). Old rows
-- keep NULL: they are reported as "unknown".
ALTER TABLE usage_ledger ADD COLUMN domain text;
ALTER TABLE usage_ledger ADD COLUMN country text;

-- Bounded cardinality: the first N distinct domains of an account in an
-- hour keep their names (listed here); later ones that hour are recorded as
-- "other" (docs/usage.md).
CREATE TABLE usage_domains_hourly (
    account_id uuid NOT NULL,
    hour       timestamptz NOT NULL,
    domain     text NOT NULL,
    PRIMARY KEY (account_id, hour, domain)
);
