-- The public address each exit's traffic leaves from, as our egress
-- reflector saw it (docs/provenance.md, abuse desk): behind NAT it is not
-- the address the exit binds, and a complaint names the one the world saw.

-- The operator says, on the enrollment token, that the exit's host sits
-- behind NAT: a public address other than the declared one is then
-- expected, not a mismatch. (An agent's own word is not enough: it would
-- let a partner dodge the mismatch flag.)
ALTER TABLE enrollment_tokens ADD COLUMN behind_nat boolean NOT NULL DEFAULT false;
ALTER TABLE exits ADD COLUMN behind_nat boolean NOT NULL DEFAULT false;
-- The verdict on the declared egress against the latest observations.
ALTER TABLE exits ADD COLUMN egress_verification text NOT NULL DEFAULT 'unobserved'
    CHECK (egress_verification IN ('unobserved', 'verified', 'behind_nat', 'mismatch'));
-- When the agent last reported, and what it could not observe then
-- ([{egress, bound, reason}]).
ALTER TABLE exits ADD COLUMN egress_reported_at timestamptz;
ALTER TABLE exits ADD COLUMN egress_unobserved jsonb NOT NULL DEFAULT '[]';

-- History per (exit, declared egress): the same observed address again
-- extends the latest row's last_seen; a different one starts a new row (a
-- residential re-dial is history, not an error). Rows are appended and
-- extended only by the control-api, from reflector answers it verified.
CREATE TABLE exit_egress_observations (
    id           bigserial PRIMARY KEY,
    exit_id      uuid NOT NULL REFERENCES exits (id),
    -- The declared egress IP (as a /32 or /128) or egress prefix.
    egress       cidr NOT NULL,
    -- The address the agent bound for the latest observation (inside egress).
    bound_ip     inet NOT NULL CHECK (bound_ip <<= egress),
    -- What the reflector saw.
    observed_ip  inet NOT NULL,
    first_seen   timestamptz NOT NULL,
    last_seen    timestamptz NOT NULL CHECK (last_seen >= first_seen)
);
CREATE INDEX exit_egress_observations_history
    ON exit_egress_observations (exit_id, egress, first_seen);
-- The abuse desk's question: which exits did the world see at this address?
CREATE INDEX exit_egress_observations_observed ON exit_egress_observations (observed_ip);

-- The verdict is projected (with the strict policy it blocks the exit), so
-- the projection version moves with it.
DROP TRIGGER exits_projection_version ON exits;
CREATE TRIGGER exits_projection_version
    BEFORE INSERT OR UPDATE OF name, source_type, owner, country, egress_ips, egress_prefixes,
                               credential_sha256, city, asn, admin_draining, disabled, source_id,
                               withdrawn_at, provenance_changed_at, egress_verification
    ON exits
    FOR EACH ROW EXECUTE FUNCTION bump_projection_version();
