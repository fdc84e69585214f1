-- PAUSE: $1 role, $2 who (cut to 200 characters), $3 why (cut to 500).
-- Ends the role's term; false when it was paused already.
-- Calls: leader_pause(text, text, text)
SELECT leader_pause($1, $2, $3)
