-- Exit provenance and consent (docs/provenance.md): every exit belongs to a
-- source that answers four questions — where the address comes from and
-- through which channel, how its owner was informed, how they opt out, who
-- is liable — and, where the address is someone else's, carries consent.

CREATE TABLE sources (
    id                  uuid PRIMARY KEY,
    name                text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    source_type         text NOT NULL CHECK (source_type IN ('dc', 'isp', 'res', 'mobile')),
    channel             text NOT NULL CHECK (channel IN ('owned', 'leased', 'isp', 'sdk', 'extension', 'sharing', 'reseller')),
    -- Supplier or owner organisation of the addresses.
    supplier            text NOT NULL DEFAULT '',
    -- Contract or agreement reference (operator-only).
    agreement_ref       text NOT NULL DEFAULT '',
    -- How the people behind the addresses are informed (notice, terms, contract).
    notice_description  text NOT NULL DEFAULT '',
    -- How they opt out (URL or instruction).
    opt_out             text NOT NULL DEFAULT '',
    -- The liable organisation and its abuse contact.
    liable_party        text NOT NULL DEFAULT '',
    abuse_contact       text NOT NULL DEFAULT '',
    -- ISO 3166-1 alpha-2 countries the source may operate in.
    countries           text[] NOT NULL DEFAULT '{}',
    -- Per-exit consent records are required (always for res/mobile and for
    -- channels that borrow someone else's line; optional for isp).
    consent_required    boolean NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (consent_required OR (source_type IN ('dc', 'isp') AND channel NOT IN ('sdk', 'extension', 'sharing')))
);

ALTER TABLE enrollment_tokens ADD COLUMN source_id uuid REFERENCES sources (id);
ALTER TABLE exits ADD COLUMN source_id uuid REFERENCES sources (id);
-- Set when the person behind the exit withdrew it (exit-agent opt-out).
ALTER TABLE exits ADD COLUMN withdrawn_at timestamptz;
-- Touched whenever the exit's source, consent or withdrawal changes, so the
-- projection version moves with them.
ALTER TABLE exits ADD COLUMN provenance_changed_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX exits_source ON exits (source_id);

DROP TRIGGER exits_projection_version ON exits;
CREATE TRIGGER exits_projection_version
    BEFORE INSERT OR UPDATE OF name, source_type, owner, country, egress_ips, credential_sha256,
                               city, asn, admin_draining, disabled, source_id, withdrawn_at,
                               provenance_changed_at
    ON exits
    FOR EACH ROW EXECUTE FUNCTION bump_projection_version();

-- The notice texts people saw, stored and served, identified by version and SHA-256.
CREATE TABLE consent_notices (
    version     text PRIMARY KEY CHECK (version ~ '^[A-Za-z0-9._-]{1,64}$'),
    sha256      text NOT NULL UNIQUE,
    body        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Consent history per exit: append-only. A change is a new version.
CREATE TABLE consent_records (
    id              bigserial PRIMARY KEY,
    exit_id         uuid NOT NULL REFERENCES exits (id),
    version         integer NOT NULL CHECK (version >= 1),
    state           text NOT NULL CHECK (state IN ('granted', 'revoked')),
    granted_at      timestamptz NOT NULL,
    method          text NOT NULL CHECK (method IN ('in_app_opt_in', 'click_through_terms', 'signed_contract')),
    notice_version  text NOT NULL REFERENCES consent_notices (version),
    notice_sha256   text NOT NULL,
    evidence_ref    text NOT NULL CHECK (length(evidence_ref) BETWEEN 1 AND 500),
    opt_out         text NOT NULL CHECK (length(opt_out) BETWEEN 1 AND 500),
    expires_at      timestamptz,
    revoked_at      timestamptz,
    revoked_reason  text,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    recorded_by     text NOT NULL,
    UNIQUE (exit_id, version),
    CHECK ((state = 'revoked') = (revoked_at IS NOT NULL))
);

CREATE FUNCTION forbid_history_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: record a new version instead', TG_TABLE_NAME
        USING ERRCODE = 'integrity_constraint_violation';
END
$$;

CREATE TRIGGER consent_records_append_only
    BEFORE UPDATE OR DELETE ON consent_records
    FOR EACH ROW EXECUTE FUNCTION forbid_history_change();
CREATE TRIGGER consent_records_no_truncate
    BEFORE TRUNCATE ON consent_records
    FOR EACH STATEMENT EXECUTE FUNCTION forbid_history_change();
CREATE TRIGGER consent_notices_append_only
    BEFORE UPDATE OR DELETE ON consent_notices
    FOR EACH ROW EXECUTE FUNCTION forbid_history_change();

-- Who reached which target through which egress IP, per minute (the abuse
-- desk's question). Written from usage batches, exactly once per batch.
CREATE TABLE target_log (
    minute       timestamptz NOT NULL,
    egress_ip    inet NOT NULL,
    exit_id      uuid NOT NULL,
    account_id   uuid NOT NULL,
    user_id      uuid NOT NULL,
    target_host  text NOT NULL,
    target_port  integer NOT NULL CHECK (target_port BETWEEN 1 AND 65535),
    tunnels      bigint NOT NULL CHECK (tunnels > 0),
    PRIMARY KEY (egress_ip, minute, exit_id, user_id, target_host, target_port)
);
CREATE INDEX target_log_minute ON target_log (minute);

-- Proxy users may be restricted to acquisition channels.
ALTER TABLE proxy_users ADD COLUMN allowed_channels text[];

CREATE INDEX audit_log_action ON audit_log (action, id);
