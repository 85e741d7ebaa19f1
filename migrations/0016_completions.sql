-- External completions: a task may end an attempt waiting for an outside party (a voice
-- platform reporting a call back, a person approving), which completes it later through the
-- API (`POST /v1/jobs/{id}/complete`) or a provider event naming its token. One row per wait:
-- a job waits at most once per attempt, and the attempt fences everything a completion or
-- the sweep does to the job.

CREATE TABLE completion_waits (
    job_id        uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt       integer NOT NULL CHECK (attempt >= 1),
    -- sha256 of the token the task handed out; the token itself is never stored.
    token_hash    bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    deadline      timestamptz NOT NULL,
    -- What the sweep does once the deadline passes with no completion (the task's choice).
    on_overdue    text NOT NULL CHECK (on_overdue IN ('retry', 'reschedule', 'fail')),
    reschedule_seconds float8 CHECK (reschedule_seconds IS NULL OR reschedule_seconds >= 0),
    -- The backoff a retry of this attempt waits, drawn from the task type's retry policy when
    -- the wait opened (`retry.rs`): a failed or overdue completion retries after it.
    retry_delay_seconds float8 NOT NULL CHECK (retry_delay_seconds >= 0),
    opened_at     timestamptz NOT NULL DEFAULT now(),
    -- How the wait ended: a completion applied it, the sweep found it overdue and applied
    -- its policy, or the job had left the wait's attempt (cancelled, a newer attempt).
    closed_at     timestamptz,
    closed_by     text CHECK (closed_by IN ('completion', 'overdue', 'superseded')),
    outcome       text CHECK (outcome IN ('success', 'failure')),
    via           text CHECK (via IN ('api', 'ingress')),
    -- sha256 of the completion as received: the same completion again is a replay.
    completion_hash bytea CHECK (completion_hash IS NULL OR length(completion_hash) = 32),
    PRIMARY KEY (job_id, attempt),
    CONSTRAINT completion_waits_closed CHECK ((closed_at IS NULL) = (closed_by IS NULL)),
    CONSTRAINT completion_waits_completed
        CHECK ((closed_by = 'completion') = (outcome IS NOT NULL AND completion_hash IS NOT NULL AND via IS NOT NULL))
);

-- The sweep reads only open waits, by deadline; closed ones (history) are never scanned.
CREATE INDEX completion_waits_open ON completion_waits (deadline) WHERE closed_at IS NULL;

-- The test-only tasks may note what they handed out (a completion token) beside an effect,
-- so tests and the chaos suite can play the outside party.
ALTER TABLE effects_ledger ADD COLUMN note text;
