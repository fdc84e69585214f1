-- RELEASE: $1 role, $2 token, $3 whether to stamp last_tick_*, $4 the
-- cooldown (ms, NULL for none), both from Release's policy in Rust.
-- Term-scoped: false means the term was already over. A SECURITY DEFINER
-- function (migration 0003).
SELECT leader_release($1, $2, $3, $4)
