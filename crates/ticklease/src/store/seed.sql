-- SEED: $1 roles. Creates the rows missing, in role order.
-- Calls: leader_seed(text[])
SELECT leader_seed($1)
