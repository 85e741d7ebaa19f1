-- Relay's own topic opt-outs and resubscribes written to SES (issue 49): when the tenant opts an
-- address out of (or back in to) a topic mapped onto an SES contact list (topic_ses_lists), the
-- API keeps the change here in the same transaction; the sweep's `ses_contacts` service writes
-- the contact's topic preference to SES (GetContact, then UpdateContact or CreateContact) and
-- keeps when it did (`applied_at`). At most one pending change per (tenant, address, topic): a
-- later change replaces it (`revision` counts the replacements, so a write of an older one is
-- not recorded as this one's). Changes SES itself reported (source `provider`) are never here.
-- Additive: a new table.
CREATE TABLE topic_ses_changes (
    id           bigserial PRIMARY KEY,
    tenant_id    uuid NOT NULL,
    address      text NOT NULL,
    topic        text NOT NULL,
    contact_list text NOT NULL,
    ses_topic    text NOT NULL,
    opt_out      boolean NOT NULL,
    revision     integer NOT NULL DEFAULT 0,
    tries        integer NOT NULL DEFAULT 0,
    next_at      timestamptz NOT NULL DEFAULT now(),
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    applied_at   timestamptz
);
CREATE UNIQUE INDEX topic_ses_changes_pending ON topic_ses_changes (tenant_id, address, topic) WHERE applied_at IS NULL;
CREATE INDEX topic_ses_changes_due ON topic_ses_changes (next_at) WHERE applied_at IS NULL;
CREATE INDEX topic_ses_changes_applied ON topic_ses_changes (applied_at) WHERE applied_at IS NOT NULL;
