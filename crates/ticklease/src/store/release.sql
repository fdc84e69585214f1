-- RELEASE: $1 role, $2 token, $3 outcome, $4 tick interval (ms). Term-scoped:
-- false means the term was already over. A SECURITY DEFINER function
-- (migration 0003) that writes the outcome's stamps and cooldown.
SELECT leader_release($1, $2, $3, $4)
