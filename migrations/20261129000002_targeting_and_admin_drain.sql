-- Targeting attributes of an exit (city, ASN) and the operator's drain switch,
-- kept apart from the agent's own draining flag that heartbeats overwrite.

ALTER TABLE exits ADD COLUMN city text CHECK (city ~ '^[a-z0-9_]{1,64}$');
ALTER TABLE exits ADD COLUMN asn bigint CHECK (asn BETWEEN 1 AND 4294967295);
ALTER TABLE exits ADD COLUMN admin_draining boolean NOT NULL DEFAULT false;

ALTER TABLE enrollment_tokens ADD COLUMN city text CHECK (city ~ '^[a-z0-9_]{1,64}$');
ALTER TABLE enrollment_tokens ADD COLUMN asn bigint CHECK (asn BETWEEN 1 AND 4294967295);
