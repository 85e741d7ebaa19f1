-- A job's terms are checked once, where they are made, by their types (`job::terms`), not again
-- by Postgres on every write of the row: a check constraint is evaluated on each new row
-- version, so each of these cost every claim and every finish, for values that never change
-- after the insert. What each relied on instead:
--   correlation_id, idempotency_key: `CorrelationId` and `IdempotencyKey` (1 to 200 characters);
--     a callback delivery's key is `callback:<job id>:<status>:<attempt>` and its correlation
--     id its subject's.
--   request_hash: `RequestHash` (32 bytes); a callback delivery's is `sha256()` of its key.
--   timeout_seconds: `Limits` (1 to 86,400); a callback delivery's is a constant asserted at build.
--   concurrency_key, concurrency_limit, both or neither: `Option<Concurrency>`.
--   attempt >= 0: it starts at 0 and the claim is the only statement that changes it (+1).
-- Kept, as they guard statements that change a row after its insert: the status values, the
-- lease, finish time and result of each status, attempts within max_attempts, max_attempts
-- within 1 to 100 (an operator's retry and a deferral raise it), children_total, callback_url.
ALTER TABLE jobs
    DROP CONSTRAINT jobs_correlation_id_check,
    DROP CONSTRAINT jobs_idempotency_key_check,
    DROP CONSTRAINT jobs_request_hash_check,
    DROP CONSTRAINT jobs_timeout_seconds_check,
    DROP CONSTRAINT jobs_concurrency_key_check,
    DROP CONSTRAINT jobs_concurrency_limit_check,
    DROP CONSTRAINT jobs_key_has_limit,
    DROP CONSTRAINT jobs_attempt_check;
