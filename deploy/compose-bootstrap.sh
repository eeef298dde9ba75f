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
source=$(curl -fsS -H "$auth" -H 'Content-Type: application/json' -X POST "$api/v1/sources" \
  -d '{"name":"compose-dc","source_type":"dc","channel":"owned","supplier":"compose demo","agreement_ref":"none: containers of this host","notice_description":"our own host","opt_out":"not applicable: operator-owned","liable_party":"whoever runs this compose stack","abuse_contact":"abuse@localhost","countries":["DE"]}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for agent in agent1 agent2; do
  curl -fsS -H "$auth" -H 'Content-Type: application/json' -X POST "$api/v1/enrollment-tokens" \
    -d "{\"name\":\"$agent\",\"source_id\":\"$source\",\"country\":\"DE\"}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])' > "/bootstrap/$agent.token"
done
touch /bootstrap/done
