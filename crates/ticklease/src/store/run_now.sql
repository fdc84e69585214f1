-- RUN NOW: $1 role. Asks for a manual run; true when the role had a cooldown.
-- Calls: leader_run_now(text)
SELECT leader_run_now($1)
