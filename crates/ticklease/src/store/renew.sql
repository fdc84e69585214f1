-- RENEW: $1 role, $2 token, $3 lease TTL (ms), $4 the holder's current
-- coordination key (NULL: none now). Term-scoped: renewed = false is a
-- definitive loss; the other columns are the row after the statement, to
-- name the reason. A SECURITY DEFINER function (migrations 0003, 0004): the
-- application role has no direct write on leader_leases.
-- Calls: leader_renew_v2(text, bigint, bigint, bigint)
SELECT renewed, db_now, holder_token, holder_id, paused FROM leader_renew_v2($1, $2, $3, $4)
