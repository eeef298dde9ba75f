-- Webhooks (docs/webhooks.md): who disabled a webhook (an operator's pause
-- binds the account), the account each delivery's event is about (the
-- delivery worker's lanes), and the index the per-account backlog cap reads.

ALTER TABLE webhooks
    -- Who disabled it, while it is disabled: 'operator' (only an operator
    -- enables it again), 'owner' (its account's key paused it) or 'failures'
    -- (its deliveries kept failing; its owner may enable it). NULL: enabled.
    ADD COLUMN disabled_by text CHECK (disabled_by IN ('operator', 'owner', 'failures'));

-- Webhooks disabled before the column existed: by the reason they recorded.
UPDATE webhooks
   SET disabled_by = CASE
           WHEN disabled_reason = 'disabled by operator' THEN 'operator'
           WHEN disabled_reason LIKE 'disabled by account:%' THEN 'owner'
           ELSE 'failures'
       END
 WHERE disabled_at IS NOT NULL;

ALTER TABLE webhook_deliveries
    -- The account the event is about; NULL for the fleet's own events
    -- (exit.withdrawn) and operator keys. An operator webhook takes its due
    -- rows round-robin over these, fleet events first, so one account's
    -- flood of events does not queue ahead of everyone else's.
    ADD COLUMN source_account uuid;

-- Rows still to send: their account from the body they carry.
UPDATE webhook_deliveries
   SET source_account = (body::jsonb -> 'data' ->> 'account_id')::uuid
 WHERE status = 'pending' AND event <> 'exit.withdrawn'
   AND (body::jsonb -> 'data' ->> 'account_id') ~ '^[0-9a-fA-F-]{36}$';

-- What an account has queued (the backlog cap counts it on every event).
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (webhook_id)
    WHERE status = 'pending';
