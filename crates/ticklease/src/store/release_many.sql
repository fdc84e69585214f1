-- RELEASE for many terms, one array entry per term: $1 roles, $2 tokens, $3
-- whether to stamp last_tick_*, $4 cooldowns (ms, NULL for none), $5
-- outcomes, $6 loss reasons, $7 error summaries. One row per term; false:
-- already over. A SECURITY DEFINER function (migration 0006) over the
-- one-row RELEASE.
-- Calls: leader_release_many(text[], bigint[], boolean[], bigint[], text[], text[], text[])
SELECT role, token, released FROM leader_release_many($1, $2, $3, $4, $5, $6, $7)
