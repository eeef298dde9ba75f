-- IP allow-list login: a request without proxy credentials from one of a
-- user's CIDRs is that user. CIDRs never overlap across users (the database
-- refuses it), so an address maps to at most one user.
CREATE TABLE user_source_cidrs (
    user_id  uuid NOT NULL REFERENCES proxy_users (id) ON DELETE CASCADE,
    cidr     cidr NOT NULL,
    EXCLUDE USING gist (cidr inet_ops WITH &&)
);
CREATE INDEX user_source_cidrs_user ON user_source_cidrs (user_id);

-- Username-grammar options applied to allow-listed traffic (which carries
-- no username): e.g. `country-de-type-dc` or `session-office1-sesstime-30`.
ALTER TABLE proxy_users ADD COLUMN allowlist_options text NOT NULL DEFAULT ''
    CHECK (allowlist_options ~ '^[A-Za-z0-9-]{0,200}$');
