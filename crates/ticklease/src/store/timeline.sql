-- TIMELINE: per role and cell of slices of the window, how many terms ended
-- (at most $4 counted) and the worst that did not complete.
-- Calls: leader_timeline(bigint, integer, integer, integer)
SELECT role, bucket, span, terms, outcome, takeover
  FROM leader_timeline($1::int8, $2::int4, $3::int4, $4::int4)
