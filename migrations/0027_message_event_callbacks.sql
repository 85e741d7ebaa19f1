-- Message events reach the tenant (issue 35): as signed callbacks (the same `callback.deliver`
-- jobs as a job's callbacks) of the types a tenant subscribes to, and as a feed.

-- The message event types a tenant's callbacks carry. The default is the terminal and negative
-- ones, so a tenant configured before this receives those and is not flooded with deliveries
-- and opens. A constant default: adding the column rewrites nothing.
ALTER TABLE tenant_callbacks
    ADD COLUMN message_events text[] NOT NULL
        DEFAULT '{message.bounced,message.complained,message.rejected,message.suppressed}';

-- The tenant of an event (its message's), for the tenant's feed in (received_at, id) order. Null
-- for an event that matches no message (nobody's to see). A suppression an event caused is kept
-- as an event of its own (`suppressed`).
ALTER TABLE message_events ADD COLUMN tenant_id uuid;
UPDATE message_events e SET tenant_id = m.tenant_id FROM messages m WHERE m.id = e.message_id;
CREATE INDEX message_events_feed ON message_events (tenant_id, received_at, id) WHERE tenant_id IS NOT NULL;
