-- Customers' reports on how an exit fares with a target site (POST
-- /v1/feedback; docs/health.md, "Customer feedback and the sites API").
-- Kept durably: corroboration counts them (reports from several accounts
-- within an hour cool an exit for the whole fleet) and an operator audits
-- them. The account-scoped and fleet cooldowns they cause live in Redis.

CREATE TABLE site_reports (
    id          bigserial PRIMARY KEY,
    -- NULL: an operator's report (an operator key or the admin token).
    account_id  uuid REFERENCES accounts (id),
    -- The API key that sent it; NULL: the admin token.
    key_id      uuid,
    exit_id     uuid NOT NULL,
    -- As cooldowns are keyed: a registrable domain, an IPv4 /24 or an
    -- IPv6 /64 (proxynet_store::site_cooldowns::site_of).
    site        text NOT NULL CHECK (octet_length(site) BETWEEN 1 AND 253),
    verdict     text NOT NULL CHECK (verdict IN ('blocked', 'slow', 'ok')),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Corroboration: the distinct accounts that reported one pair lately.
CREATE INDEX site_reports_pair ON site_reports (exit_id, site, created_at);
-- An account's view of GET /v1/sites: the sites it reported lately.
CREATE INDEX site_reports_account ON site_reports (account_id, created_at);
