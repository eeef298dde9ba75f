-- Which expired consents were announced (`exit.withdrawn`, cause
-- `consent_expired`; docs/webhooks.md): each at most once, by whichever
-- control-api saw it first. consent_records is append-only, so the mark
-- lives here.
CREATE TABLE consent_expiry_notices (
    consent_id    bigint PRIMARY KEY REFERENCES consent_records (id),
    exit_id       uuid NOT NULL,
    -- The consent's instant: marks older than the sweep's look-back are
    -- pruned (webhooks/consent.rs).
    expires_at    timestamptz NOT NULL,
    announced_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consent_expiry_notices_expiry ON consent_expiry_notices (expires_at);

-- Consents that had expired before this table existed are not news (only
-- the sweep's look-back needs marking).
INSERT INTO consent_expiry_notices (consent_id, exit_id, expires_at)
SELECT id, exit_id, expires_at FROM consent_records
 WHERE expires_at <= now() AND expires_at > now() - interval '8 days';

-- The sweep looks at granted consents whose instant has just passed.
CREATE INDEX consent_records_expiry ON consent_records (expires_at)
    WHERE state = 'granted' AND expires_at IS NOT NULL;
