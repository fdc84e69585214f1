-- RENEW: $1 role, $2 token, $3 lease TTL (ms). Term-scoped: renewed = false is
-- a definitive loss; the other columns are the row after the statement, to
-- name the reason. A SECURITY DEFINER function (migration 0003): the
-- application role has no direct write on leader_leases.
SELECT renewed, db_now, holder_token, holder_id, paused FROM leader_renew($1, $2, $3)
