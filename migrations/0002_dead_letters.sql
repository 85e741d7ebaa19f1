-- Messages Relay could not turn into work, kept whole with the reason: an ingress record
-- whose body does not parse, a work-queue message that is not a work message. Nothing
-- received is dropped silently; an operator reads, fixes and replays from here.

CREATE TABLE dead_letters (
    id           uuid PRIMARY KEY,
    -- Where it came from: the function and the queue or topic (e.g. 'ingress:<queue arn>').
    source       text NOT NULL CHECK (source <> '' AND length(source) <= 500),
    -- The provider's id for the message (SQS messageId), when it had one.
    message_id   text,
    -- The body exactly as received.
    body         text NOT NULL,
    reason       text NOT NULL CHECK (reason <> ''),
    received_at  timestamptz NOT NULL DEFAULT now()
);
-- A redelivered message is kept once.
CREATE UNIQUE INDEX dead_letters_source_message ON dead_letters (source, message_id) WHERE message_id IS NOT NULL;
CREATE INDEX dead_letters_received ON dead_letters (received_at);
