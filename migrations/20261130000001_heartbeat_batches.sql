-- Heartbeats reach Postgres in batches (control-api/src/liveness.rs): the
-- agent's open tunnel count rides along with the last beat.
ALTER TABLE exits ADD COLUMN active_tunnels bigint NOT NULL DEFAULT 0 CHECK (active_tunnels >= 0);
