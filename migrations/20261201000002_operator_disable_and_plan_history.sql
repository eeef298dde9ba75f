-- A user an operator disabled stays disabled whatever the account's keys
-- say; only an operator re-enables it.
ALTER TABLE proxy_users ADD COLUMN disabled_by_operator boolean NOT NULL DEFAULT false;

-- Which plan an account was on, and since when: a ledger row is priced by
-- the plan in force at its minute, however late it is recorded (a Postgres
-- outage, a batch taken over from a dead control-api).
CREATE TABLE account_plan_history (
    account_id  uuid NOT NULL REFERENCES accounts (id),
    plan_id     uuid REFERENCES plans (id),
    from_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, from_at)
);
INSERT INTO account_plan_history (account_id, plan_id, from_at)
SELECT id, plan_id, '-infinity' FROM accounts WHERE plan_id IS NOT NULL;
