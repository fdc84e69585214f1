-- RENEW for many terms: $1 roles, $2 their tokens, $3 lease TTL (ms), $4 the
-- coordination key (or NULL). One row per term, each term-scoped as the
-- one-row RENEW: renewed = false is that term's definitive loss. A SECURITY
-- DEFINER function (migration 0006).
-- Calls: leader_renew_many(text[], bigint[], bigint, bigint)
SELECT role, token, renewed, db_now, holder_token, holder_id, paused
  FROM leader_renew_many($1, $2, $3, $4)
