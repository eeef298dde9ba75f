-- Plans: prices per GB (10^9 bytes, up + down) by exit source type, in cents.
CREATE TABLE plans (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE plan_prices (
    plan_id       uuid NOT NULL REFERENCES plans (id),
    source_type   text NOT NULL CHECK (source_type IN ('dc', 'isp', 'res', 'mobile')),
    cents_per_gb  bigint NOT NULL CHECK (cents_per_gb >= 0),
    PRIMARY KEY (plan_id, source_type)
);

ALTER TABLE accounts ADD COLUMN plan_id uuid REFERENCES plans (id);
