-- Soft warning threshold of a bandwidth quota, in percent of the hard cap.
ALTER TABLE proxy_users ADD COLUMN quota_warn_percent integer NOT NULL DEFAULT 80
    CHECK (quota_warn_percent BETWEEN 1 AND 100);
