-- GET /v1/messages without a filter: a tenant's most recent messages, newest first.
CREATE INDEX messages_recent ON messages (tenant_id, created_at DESC, id DESC);
