-- The ISO 3166-2 subdivision an exit is in (`DE-BY`, `US-CA`), declared by
-- the operator on the enrollment token beside country, city and ASN, and
-- carried into the exit row at enrollment: the `state` / `region` username
-- key matches it. Upper case; its country part is the row's own country.
ALTER TABLE enrollment_tokens ADD COLUMN region text
    CHECK (region ~ '^[A-Z]{2}-[A-Z0-9]{1,3}$' AND left(region, 2) = country);
ALTER TABLE exits ADD COLUMN region text
    CHECK (region ~ '^[A-Z]{2}-[A-Z0-9]{1,3}$' AND left(region, 2) = country);
-- The projection version trigger (exits_projection_version) is left as it
-- is: the region is written with the row at enrollment and never updated,
-- and INSERT already bumps the version.
