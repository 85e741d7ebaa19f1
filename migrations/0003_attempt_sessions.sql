-- The AWS role sessions each attempt assumed (per-task credentials): which role, which
-- session ARN (what CloudTrail names as the caller), when, and until when. One row per
-- AssumeRole call, so a refresh during a long run is a row of its own. Written when the
-- session is assumed, not at attempt end: it answers "what could this job touch" while the
-- job still runs.

CREATE TABLE attempt_sessions (
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt      integer NOT NULL CHECK (attempt >= 1),
    role_arn     text NOT NULL CHECK (role_arn <> ''),
    session_arn  text NOT NULL CHECK (session_arn <> ''),
    -- The tenant's external id was sent (the role lives in the tenant's account).
    external_id  boolean NOT NULL DEFAULT false,
    assumed_at   timestamptz NOT NULL DEFAULT now(),
    -- STS's clock, not the database's.
    expires_at   timestamptz NOT NULL
);
CREATE INDEX attempt_sessions_job ON attempt_sessions (job_id, attempt, assumed_at);
