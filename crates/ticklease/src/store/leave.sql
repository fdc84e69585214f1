-- LEAVE: $1 family, $2 holder id. Whether a registration was removed.
-- Calls: leader_replica_leave(text, text)
SELECT leader_replica_leave($1, $2)
