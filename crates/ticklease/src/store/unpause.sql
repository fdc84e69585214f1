-- UNPAUSE: $1 role. False when it was not paused.
-- Calls: leader_unpause(text)
SELECT leader_unpause($1)
