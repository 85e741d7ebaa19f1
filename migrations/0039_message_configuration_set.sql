-- The configuration set a message was sent (or shadowed) under, so sending reputation is
-- counted per configuration set as well as per tenant (`store::reputation::by_configuration_set`,
-- the status contract's `reputation`). Null for messages recorded before, and for sends that
-- named none with no default set. Additive.
ALTER TABLE messages ADD COLUMN configuration_set text;
-- The status document reads the last window's messages that name a set, by time.
CREATE INDEX messages_by_configuration_set ON messages (created_at, configuration_set)
    WHERE configuration_set IS NOT NULL;
