#!/bin/sh
# `ticklease run` as a client of the black-box check (docs/black-box.md): the
# runner leads the role, with its coordination session on the same URL; each
# term's child is the contract's work in psql, fenced with the token the
# runner gives it. TICKLEASE_BIN names the ticklease binary.
set -eu
case "$TICKLEASE_SCHEDULE" in
    "every "*) schedule="--every=${TICKLEASE_SCHEDULE#every }ms" ;;
    "cron "*) schedule="--cron=${TICKLEASE_SCHEDULE#cron }" ;;
    *)
        echo "blackbox.sh: TICKLEASE_SCHEDULE is 'every <ms>' or 'cron <expr>', not '$TICKLEASE_SCHEDULE'" >&2
        exit 2
        ;;
esac
work_s=$(awk "BEGIN { print $TICKLEASE_WORK_MS / 1000 }")
# A claim that inserts no row (fenced off) or fails to commit ends the work
# with exit 3: the term is over, which the runner learns at its next RENEW.
work='
claim() {
    seq=$(psql "$TICKLEASE_URL" -X -q -At -v ON_ERROR_STOP=1 -v role="$TICKLEASE_ROLE" \
          -v token="$TICKLEASE_TOKEN" -v replica="$TICKLEASE_REPLICA" <<SQL
BEGIN;
INSERT INTO blackbox_claims (role, token, replica, seq, at, occurrence)
SELECT :'"'"'role'"'"', :token, :'"'"'replica'"'"', n.seq, clock_timestamp(),
       (SELECT l.occurrence FROM leader_leases AS l WHERE l.role = :'"'"'role'"'"')
  FROM (SELECT coalesce(max(c.seq), 0) + 1 AS seq FROM blackbox_claims AS c WHERE c.role = :'"'"'role'"'"') AS n
 WHERE (SELECT leader_fence_v2(:'"'"'role'"'"', :token))
RETURNING seq;
COMMIT;
SQL
    ) || exit 3
    [ -n "$seq" ] || exit 3
}
claim
sleep '"$work_s"'
claim
'
exec "$TICKLEASE_BIN" run "$TICKLEASE_ROLE" --database-url "$TICKLEASE_URL" --direct-url "$TICKLEASE_URL" \
    "$schedule" \
    --lease-ttl "${TICKLEASE_LEASE_TTL_MS}ms" --heartbeat-every "${TICKLEASE_HEARTBEAT_MS}ms" \
    --statement-timeout "${TICKLEASE_STATEMENT_TIMEOUT_MS}ms" --abandon-after "${TICKLEASE_ABANDON_MS}ms" \
    --max-poll "${TICKLEASE_MAX_POLL_MS}ms" --shell -- "$work"
