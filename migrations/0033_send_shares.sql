-- Fair shares of a send rate many tenants' sends keep (`email::pace`, `store::send_shares`).
--
-- A tenant's weight in those shares, set by an operator on its `send_rates` row (scope
-- `tenant`; null: 1), audited with the rates.
ALTER TABLE send_rates ADD COLUMN weight double precision CHECK (weight > 0 AND weight <= 1000);
ALTER TABLE send_rate_audit ADD COLUMN old_weight double precision, ADD COLUMN new_weight double precision;

-- Per shared rate (its `rate_slots` key: an SES account's, a configuration set's) and tenant:
-- when the tenant last asked for a slot under it (it is waiting while that is recent), and the
-- slots it booked there that are still ahead (pruned at each ask).
CREATE TABLE send_shares (
    key       text NOT NULL,
    tenant    text NOT NULL,
    asked_at  timestamptz NOT NULL DEFAULT now(),
    booked    timestamptz[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (key, tenant)
);
