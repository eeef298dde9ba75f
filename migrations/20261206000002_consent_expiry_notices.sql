-- Which expired consents were announced (`exit.withdrawn`, cause
-- `consent_expired`; docs/webhooks.md): each at most once, by whichever
-- control-api saw it first. consent_records is append-only, so the mark
-- lives here.
CREATE TABLE consent_expiry_notices (
    consent_id    bigint PRIMARY KEY REFERENCES consent_records (id),
    exit_id       uuid NOT NULL,
    announced_at  timestamptz NOT NULL DEFAULT now()
);

-- Consents that had expired before this table existed are not news.
INSERT INTO consent_expiry_notices (consent_id, exit_id)
SELECT id, exit_id FROM consent_records WHERE expires_at <= now();

-- The sweep looks at granted consents whose instant has just passed.
CREATE INDEX consent_records_expiry ON consent_records (expires_at)
    WHERE state = 'granted' AND expires_at IS NOT NULL;
