-- Sending at the provider's pace (`email::pace`).
--
-- `rate_slots` is the one next-free-slot mechanism every worker and Lambda container shares:
-- the next moment a call under a key may start. Destinations' slots move here from
-- `http_destinations.next_slot` (kept, unused, so the previous code runs during a deploy),
-- and SES's account, a tenant's sends and a configuration set's take theirs here too.
CREATE TABLE rate_slots (
    key        text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 300),
    next_slot  timestamptz NOT NULL DEFAULT '-infinity',
    -- Slots taken under this key, ever: an SES account's sends since its quota was read.
    taken      bigint NOT NULL DEFAULT 0
);
INSERT INTO rate_slots (key, next_slot)
SELECT 'destination:' || tenant_id || ':' || name, next_slot FROM http_destinations;

-- The rates email is sent at: an SES account's (read from SES `GetAccount` by the sweep, or
-- set by an operator, which wins), a tenant's and a configuration set's (set by operators).
-- `factor` is the account's throttle back-off (AIMD): halved on a throttle answer, grown back
-- with time; the effective account rate is the base rate times it.
CREATE TABLE send_rates (
    scope             text NOT NULL CHECK (scope IN ('account', 'tenant', 'configuration_set')),
    key               text NOT NULL CHECK (key ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    rate_per_second   double precision CHECK (rate_per_second > 0 AND rate_per_second <= 10000),
    provider_rate     double precision,
    max_24h           double precision,
    sent_24h          double precision,
    read_at           timestamptz,
    -- The account's `rate_slots.taken` when the quota was read: sends since are taken - this.
    taken_at_read     bigint,
    read_error        text,
    factor            double precision NOT NULL DEFAULT 1 CHECK (factor > 0 AND factor <= 1),
    factor_at         timestamptz NOT NULL DEFAULT now(),
    throttles         bigint NOT NULL DEFAULT 0,
    last_throttle_at  timestamptz,
    updated_by        text,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- Every operator change of a rate.
CREATE TABLE send_rate_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope       text NOT NULL,
    key         text NOT NULL,
    old_rate    double precision,
    new_rate    double precision,
    changed_by  text NOT NULL,
    reason      text,
    at          timestamptz NOT NULL DEFAULT now()
);

-- Why a deferred job waits: written with the deferral (`jobs::continue_later`) when a rate held
-- it; it applies while the job is pending with this `run_at`.
CREATE TABLE job_rate_waits (
    job_id  uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    rate    text NOT NULL,
    until   timestamptz NOT NULL
);
