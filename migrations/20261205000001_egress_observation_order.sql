-- "The latest observation" of an egress is ordered by first_seen and then
-- by id (reflections carry whole seconds, so two rows may share a second):
-- the history index carries the tie-breaker, so latest-first reads stay
-- index scans.
CREATE INDEX exit_egress_observations_history_ordered
    ON exit_egress_observations (exit_id, egress, first_seen, id);
DROP INDEX exit_egress_observations_history;
