-- Email (issue 6). `messages` is the at-most-once record: one row per tenant and message key,
-- written as an intent in its own committed transaction before SES is called, so a second
-- attempt (or a second job with the same key) finds it and never sends again. Deferred
-- outcomes (deliveries, bounces, opens) live here, on the message, never on the job.
-- No foreign key to jobs: retention deletes old jobs, messages are the domain record.

-- The addresses and domains a tenant may send from (managed by operators).
CREATE TABLE sending_identities (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    -- `someone@example.com` (that address) or `example.com` (any address at the domain).
    identity    text NOT NULL CHECK (identity = lower(identity) AND identity <> ''),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, identity)
);

-- Per-tenant templates, rendered with minijinja (strict: a missing variable is an error).
CREATE TABLE email_templates (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        text NOT NULL,
    subject     text NOT NULL,
    text_body   text,
    html_body   text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name),
    CHECK (text_body IS NOT NULL OR html_body IS NOT NULL)
);

CREATE TABLE messages (
    id                   uuid PRIMARY KEY,
    tenant_id            uuid NOT NULL REFERENCES tenants (id),
    message_key          text NOT NULL,
    job_id               uuid NOT NULL,
    -- The job attempt that recorded the intent: the fence the send was made under.
    attempt              integer NOT NULL,
    correlation_id       text NOT NULL,
    -- shadowed | refused | sending | throttled | unknown | rejected | sent | delayed
    -- | delivered | bounced | complained (see `store::messages::Status`).
    status               text NOT NULL,
    reason               text,
    from_address         text NOT NULL,
    recipients           jsonb NOT NULL,
    subject              text NOT NULL,
    provider_message_id  text UNIQUE,
    opens                integer NOT NULL DEFAULT 0,
    clicks               integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    sent_at              timestamptz,
    UNIQUE (tenant_id, message_key)
);
CREATE INDEX messages_correlation ON messages (tenant_id, correlation_id, created_at);
CREATE INDEX messages_job ON messages (job_id);

-- Provider events, each applied once (`event_key` is the SNS message id). An event that
-- matches no message is kept whole with the reason (`message_id` null).
CREATE TABLE message_events (
    id           bigserial PRIMARY KEY,
    event_key    text NOT NULL UNIQUE,
    message_id   uuid REFERENCES messages (id),
    -- send | delivery | bounce | complaint | reject | open | click | delivery_delay
    -- | rendering_failure | subscription | inbound
    event_type   text NOT NULL,
    occurred_at  timestamptz,
    note         text,
    detail       jsonb NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX message_events_message ON message_events (message_id, id);

-- Addresses a tenant will not send to: hard bounces and complaints add them; operators and
-- the tenant can remove them.
CREATE TABLE suppressions (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    address     text NOT NULL CHECK (address = lower(address)),
    -- bounce | complaint | manual
    reason      text NOT NULL,
    detail      text,
    message_id  uuid,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, address)
);

-- One alert email per new exception, sent by the sweep (`crate::alerts`): when it was sent.
ALTER TABLE exceptions ADD COLUMN alerted_at timestamptz;
CREATE INDEX exceptions_to_alert ON exceptions (opened_at) WHERE status = 'open' AND alerted_at IS NULL;
