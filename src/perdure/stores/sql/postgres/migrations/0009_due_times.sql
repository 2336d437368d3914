-- perdure PostgreSQL schema, version 9: what a node asks while idle or claiming reads
-- only objects that are due or held, however many sleep. objects_due holds each
-- runnable object's due time (its ready time, or its lease expiry if later):
-- next_ready_at is its first entry. objects_ready leaves out paused objects (whose
-- ready time stays in the past): the claim walks it from the oldest ready time. It
-- indexes ready_at + 0 so that ANALYZE keeps statistics over its rows alone.
DROP INDEX objects_ready;
CREATE INDEX objects_ready ON objects ((ready_at + 0))
WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
CREATE INDEX objects_due ON objects ((GREATEST(ready_at, COALESCE(lease_expires, ready_at))))
WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
