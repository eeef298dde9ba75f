-- Bandwidth quota per user and period (bytes up + down).
ALTER TABLE proxy_users ADD COLUMN bandwidth_bytes bigint CHECK (bandwidth_bytes > 0);
ALTER TABLE proxy_users ADD COLUMN quota_period text NOT NULL DEFAULT 'monthly'
    CHECK (quota_period IN ('daily', 'monthly'));
