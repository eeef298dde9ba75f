-- Dedicated IPs: an egress address (or an IPv6 /64 of an exit's egress
-- prefix) allocated to one account. Each row is one allocation interval:
-- a release, a replacement or a move closes it (`released_at`) and a new
-- row opens the next, so invoices count address-days from the rows alone.
CREATE TABLE dedicated_ips (
    id               uuid PRIMARY KEY,
    account_id       uuid NOT NULL REFERENCES accounts (id),
    exit_id          uuid NOT NULL REFERENCES exits (id),
    -- One address ('192.0.2.7') or a prefix ('2001:db8:1:2::/64'), as the
    -- gateway prints them (the key the API takes).
    address          text NOT NULL CHECK (length(address) BETWEEN 2 AND 64),
    is_prefix        boolean NOT NULL,
    allocated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    released_at      timestamptz,
    release_reason   text CHECK (release_reason IN ('released', 'replaced', 'moved', 'exit_deleted', 'account_deleted')),
    -- The allocation this one replaced (a replacement counts against the
    -- account's allowance).
    replaces         uuid REFERENCES dedicated_ips (id),
    -- Price per address (or prefix) per calendar month in force when the
    -- allocation was made: re-pricing a plan never re-prices the past.
    cents_per_month  bigint NOT NULL DEFAULT 0 CHECK (cents_per_month >= 0),
    -- 'operator' or 'account': who made the allocation.
    allocated_by     text NOT NULL CHECK (allocated_by IN ('operator', 'account')),
    -- The users it serves were set by an operator: the account cannot change them.
    users_by_operator boolean NOT NULL DEFAULT false,
    CHECK (released_at IS NULL OR released_at >= allocated_at)
);

-- An address is held by one account at a time, and no held address lies
-- inside another held one (a single IPv6 address inside someone's /64).
CREATE UNIQUE INDEX dedicated_ips_held ON dedicated_ips (address) WHERE released_at IS NULL;
ALTER TABLE dedicated_ips ADD CONSTRAINT dedicated_ips_no_overlap
    EXCLUDE USING gist ((address::inet) inet_ops WITH &&) WHERE (released_at IS NULL);
CREATE INDEX dedicated_ips_account ON dedicated_ips (account_id, allocated_at);
CREATE INDEX dedicated_ips_exit ON dedicated_ips (exit_id) WHERE released_at IS NULL;

-- An account may split its addresses among its users: none listed, every
-- user of the account may use the address.
CREATE TABLE dedicated_ip_users (
    dedicated_ip_id uuid NOT NULL REFERENCES dedicated_ips (id) ON DELETE CASCADE,
    user_id         uuid NOT NULL REFERENCES proxy_users (id) ON DELETE CASCADE,
    PRIMARY KEY (dedicated_ip_id, user_id)
);

ALTER TABLE plans
    ADD COLUMN dedicated_ip_price_cents bigint NOT NULL DEFAULT 0 CHECK (dedicated_ip_price_cents >= 0),
    ADD COLUMN dedicated_prefix_price_cents bigint NOT NULL DEFAULT 0 CHECK (dedicated_prefix_price_cents >= 0),
    -- Replacements an account may make per calendar month.
    ADD COLUMN dedicated_replacements_per_month integer NOT NULL DEFAULT 2 CHECK (dedicated_replacements_per_month >= 0),
    -- Addresses (and prefixes) an account may hold at once by its own key;
    -- an operator may allocate beyond it. Without a plan: none.
    ADD COLUMN dedicated_max_addresses integer NOT NULL DEFAULT 0 CHECK (dedicated_max_addresses >= 0);

-- When an account's dedicated addresses are all unusable (their exits
-- down), route through shared addresses instead of answering 502.
ALTER TABLE accounts ADD COLUMN dedicated_fallback boolean NOT NULL DEFAULT false;
-- The user always routes through its account's dedicated addresses, as if
-- every username said `-dedicated`.
ALTER TABLE proxy_users ADD COLUMN dedicated_only boolean NOT NULL DEFAULT false;

-- The metrics sampler counts held addresses per account every few seconds.
CREATE INDEX dedicated_ips_held_by_account ON dedicated_ips (account_id) WHERE released_at IS NULL;
