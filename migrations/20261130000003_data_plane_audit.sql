-- Audit events reported by the data plane arrive through the usage stream;
-- their id makes recording them idempotent.
ALTER TABLE audit_log ADD COLUMN source_ref uuid;
CREATE UNIQUE INDEX audit_log_source_ref ON audit_log (source_ref);
