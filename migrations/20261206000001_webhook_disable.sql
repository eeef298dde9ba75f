-- A webhook whose receiver keeps failing is disabled (docs/webhooks.md,
-- "When a receiver keeps failing"): no new events are queued for it and its
-- pending deliveries are given up, until its owner enables it again.

ALTER TABLE webhooks
    -- Set when it was disabled, by its failures or by its owner; NULL: enabled.
    ADD COLUMN disabled_at      timestamptz,
    ADD COLUMN disabled_reason  text CHECK (octet_length(disabled_reason) <= 512),
    -- Deliveries that ended failed since the last one delivered (or since it
    -- was enabled, or since a quiet gap: delivery.rs RUN_GAP), when the
    -- first of them ended, and when the last did.
    ADD COLUMN failed_in_row    integer NOT NULL DEFAULT 0 CHECK (failed_in_row >= 0),
    ADD COLUMN failing_since    timestamptz,
    ADD COLUMN last_failed_at   timestamptz;
