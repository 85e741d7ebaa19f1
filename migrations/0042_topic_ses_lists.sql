-- A tenant's topic may name the SES contact list and topic it maps onto (issue 49): a live send
-- naming the topic carries SES's ListManagementOptions, so SES's own unsubscribe link and
-- header apply. Relay's opt-outs (topic_opt_outs) stay authoritative. Additive: a new table.
CREATE TABLE topic_ses_lists (
    tenant_id    uuid NOT NULL,
    topic        text NOT NULL,
    contact_list text NOT NULL,
    ses_topic    text NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, topic)
);
