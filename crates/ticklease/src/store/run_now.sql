-- RUN NOW: $1 role. Clears its cooldown; false when it had none.
-- Calls: leader_run_now(text)
SELECT leader_run_now($1)
