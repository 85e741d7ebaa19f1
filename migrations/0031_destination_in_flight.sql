-- A destination's calls in flight are bounded (`max_in_flight`, across every worker): a
-- destination that stops answering holds at most that many running slots anywhere, and the
-- jobs past it wait pending (`waiting_reason` rate_limited, `destination_in_flight:<name>`)
-- instead of each holding a slot for its whole timeout.
--
-- The calls in flight are those recorded `sending` whose attempt still runs; the partial index
-- holds only unsettled calls, so counting them reads a handful of entries.

ALTER TABLE http_destinations
    ADD COLUMN max_in_flight integer NOT NULL DEFAULT 10 CHECK (max_in_flight BETWEEN 1 AND 1000);

CREATE INDEX http_calls_sending ON http_calls (tenant_id, destination) WHERE outcome = 'sending';
