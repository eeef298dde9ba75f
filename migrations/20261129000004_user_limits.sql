-- Per-user tunnel limits, enforced by every superproxy together.
ALTER TABLE proxy_users ADD COLUMN max_concurrent_tunnels integer CHECK (max_concurrent_tunnels > 0);
ALTER TABLE proxy_users ADD COLUMN max_new_tunnels_per_second integer CHECK (max_new_tunnels_per_second > 0);
