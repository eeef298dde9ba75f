-- Monotonic projection: every change to a projected row takes a fresh number
-- from one sequence, and the Redis projection only ever replaces a record
-- with a newer one (control-api/src/projector.rs), so a slow full resync can
-- never write back a state that a later change already replaced.
CREATE SEQUENCE projection_version;
SELECT setval('projection_version', GREATEST((SELECT COALESCE(max(version), 0) FROM proxy_users), 1));

CREATE FUNCTION bump_projection_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := nextval('projection_version');
    RETURN NEW;
END
$$;

CREATE TRIGGER proxy_users_projection_version
    BEFORE INSERT OR UPDATE ON proxy_users
    FOR EACH ROW EXECUTE FUNCTION bump_projection_version();

ALTER TABLE exits ADD COLUMN version bigint NOT NULL DEFAULT 0;
UPDATE exits SET version = nextval('projection_version');
-- Only the projected columns: heartbeat bookkeeping does not bump it.
CREATE TRIGGER exits_projection_version
    BEFORE INSERT OR UPDATE OF name, source_type, owner, country, egress_ips, credential_sha256,
                               city, asn, admin_draining, disabled
    ON exits
    FOR EACH ROW EXECUTE FUNCTION bump_projection_version();
