-- RELEASE: $1 role, $2 token, $3 whether to stamp last_tick_*, $4 the
-- cooldown (ms, NULL for none), both from Release's policy in Rust; $5 the
-- outcome, $6 why a term was lost, $7 a short error summary, $8 the last
-- part of what the work said (Tick::keep_output), for the role's history. Term-scoped: false means the term was already over. A
-- SECURITY DEFINER function (migrations 0003, 0005).
-- Calls: leader_release(text, bigint, boolean, bigint, text, text, text, text)
SELECT leader_release($1, $2, $3, $4, $5, $6, $7, $8)
