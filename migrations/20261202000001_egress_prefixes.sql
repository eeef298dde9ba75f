-- Prefixes an exit sends from any address of (the superproxy picks one per
-- tunnel), declared at enrollment beside its egress IPs. An exit needs at
-- least one of either; a prefix-only exit has no egress IP at all.
ALTER TABLE exits ADD COLUMN egress_prefixes text[] NOT NULL DEFAULT '{}'
    CHECK (cardinality(egress_prefixes) <= 64);
ALTER TABLE exits DROP CONSTRAINT exits_egress_ips_check;
ALTER TABLE exits ADD CONSTRAINT exits_egress_addresses_check
    CHECK (cardinality(egress_ips) <= 256
           AND cardinality(egress_ips) + cardinality(egress_prefixes) >= 1);

-- The projection version moves when the prefixes do, like the egress IPs.
DROP TRIGGER exits_projection_version ON exits;
CREATE TRIGGER exits_projection_version
    BEFORE INSERT OR UPDATE OF name, source_type, owner, country, egress_ips, egress_prefixes,
                               credential_sha256, city, asn, admin_draining, disabled, source_id,
                               withdrawn_at, provenance_changed_at
    ON exits
    FOR EACH ROW EXECUTE FUNCTION bump_projection_version();
