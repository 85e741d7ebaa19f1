-- How many times the sweep has sent a job again, unclaimed, since its last claim. A row that
-- was dispatched but not claimed is presumed lost after the grace period and sent again; each
-- further re-send of the same row waits twice as long (grace × 2^resends, at most 32 × grace).
-- A queue that is only behind (an outage just over, a throttled consumer) so gets a handful of
-- copies of each row instead of one per grace period. A claim resets it (`CLAIM_UPDATE`).
ALTER TABLE jobs ADD COLUMN resends smallint NOT NULL DEFAULT 0;
