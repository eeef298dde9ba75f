#!/bin/sh
# One-shot set-up for compose.yaml: a demo account and proxy user, and one
# enrollment token per agent in /bootstrap (skipped when already done).
set -eu
api="http://control-api:7070"
auth="Authorization: Bearer $PROXYNET_ADMIN_TOKEN"
[ -f /bootstrap/done ] && exit 0
acct=$(curl -fsS -H "$auth" -H 'Content-Type: application/json' -X POST "$api/v1/accounts" -d '{"name":"demo"}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
curl -fsS -H "$auth" -H 'Content-Type: application/json' -X POST "$api/v1/accounts/$acct/users" \
  -d "{\"username\":\"demo\",\"password\":\"$PROXYNET_DEMO_PASSWORD\"}" >/dev/null
for agent in agent1 agent2; do
  curl -fsS -H "$auth" -H 'Content-Type: application/json' -X POST "$api/v1/enrollment-tokens" \
    -d "{\"name\":\"$agent\",\"source_type\":\"dc\",\"owner\":\"compose\",\"country\":\"DE\"}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])' > "/bootstrap/$agent.token"
done
touch /bootstrap/done
