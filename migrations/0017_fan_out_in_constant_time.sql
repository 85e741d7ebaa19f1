-- Keyed claims in constant time: a claim takes a key's oldest pending jobs in (run_at, id)
-- order. With the id in the index that order is a walk of the index from the key's head, as
-- long as the free slots; without it, every pending job of the key was sorted on each claim
-- (a campaign's children share one run_at), a cost in proportion to the jobs behind the key.
DROP INDEX jobs_keyed_pending;
CREATE INDEX jobs_keyed_pending ON jobs (concurrency_key, run_at, id)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;

-- A fan-out parent closes when none of its children is still live. Probing for a live child
-- along `jobs_parent` (every child) walked past all the children already ended, after every
-- batch of children ending: a cost in proportion to the campaign's progress. This index holds
-- the live children only.
CREATE INDEX jobs_open_children ON jobs (parent_id)
    WHERE parent_id IS NOT NULL AND status IN ('pending', 'running', 'waiting');
