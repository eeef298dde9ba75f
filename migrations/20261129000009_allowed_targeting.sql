-- Which exits a proxy user may use at all (NULL: any).
ALTER TABLE proxy_users ADD COLUMN allowed_source_types text[];
ALTER TABLE proxy_users ADD COLUMN allowed_countries text[];
