-- Subscription topics (issue 49): an address may opt out of one of its tenant's topics (a send
-- naming that topic, `email.send`'s `topic`, is skipped for it) beside the suppression list,
-- which still blocks every send. Added and removed by the tenant (API); `provider` is kept for
-- opt-outs an SES subscription event will make. `message_id`: the message the opt-out came
-- through, when one was named (its `message.resubscribed` event is kept on it).
CREATE TABLE topic_opt_outs (
    tenant_id  uuid NOT NULL,
    address    text NOT NULL,
    topic      text NOT NULL,
    source     text NOT NULL CHECK (source IN ('api', 'provider')),
    message_id uuid,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, address, topic)
);
