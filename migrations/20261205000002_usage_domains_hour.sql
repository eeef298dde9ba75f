-- The hourly prune of usage_domains_hourly deletes by hour alone; the
-- primary key leads with account_id, so without this it scans the table.
CREATE INDEX usage_domains_hourly_hour ON usage_domains_hourly (hour);
