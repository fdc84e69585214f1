-- BEAT: $1 family, $2 holder id, $3 registration TTL (ms, capped at a
-- minute by the database), $4 the coordination key (or NULL). The replicas
-- serving the family, at most 1,000, this one among them.
-- Calls: leader_replica_beat(text, text, bigint, bigint)
SELECT holder_id FROM leader_replica_beat($1, $2, $3, $4)
