-- The addresses the control plane has verified an exit holds: for each
-- declared egress whose latest reflector observation saw the exit's
-- traffic leave from inside it, the address the reflector saw
-- (routes/egress.rs keeps it with every report). It is projected into the
-- exit's record, where the heartbeat reads it: an agent's admin listener
-- enters the fleet's protected set only on one of these addresses, never
-- on an egress the agent merely declared (docs/provenance.md).
ALTER TABLE exits ADD COLUMN verified_egress text[] NOT NULL DEFAULT '{}';

-- Projected, so the projection version moves with it. Recreated before the
-- backfill below, which then bumps the version of every exit it fills in
-- (the next resync writes their records).
DROP TRIGGER exits_projection_version ON exits;
CREATE TRIGGER exits_projection_version
    BEFORE INSERT OR UPDATE OF name, source_type, owner, country, egress_ips, egress_prefixes,
                               credential_sha256, city, asn, admin_draining, disabled, source_id,
                               withdrawn_at, provenance_changed_at, egress_verification,
                               verified_egress
    ON exits
    FOR EACH ROW EXECUTE FUNCTION bump_projection_version();

-- What the observations recorded so far already verify: the latest row of
-- each declared egress (ordered as everywhere: first_seen, then id) whose
-- observed address lies inside it.
UPDATE exits e SET verified_egress = ARRAY(
    SELECT host(l.observed_ip) FROM (
        SELECT DISTINCT ON (o.egress) o.egress, o.observed_ip
          FROM exit_egress_observations o
         WHERE o.exit_id = e.id
         ORDER BY o.egress, o.first_seen DESC, o.id DESC
    ) l
     WHERE l.observed_ip <<= l.egress
     ORDER BY 1)
 WHERE EXISTS (SELECT 1 FROM exit_egress_observations o WHERE o.exit_id = e.id);
