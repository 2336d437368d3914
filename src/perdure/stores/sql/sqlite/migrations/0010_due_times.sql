-- perdure SQLite schema, version 10: what a node asks while idle or claiming reads only
-- objects that are due or held, however many sleep. objects_due holds each runnable
-- object's due time (its ready time, or its lease expiry if later): next_ready_at is
-- its first entry. objects_ready leaves out paused objects (whose ready time stays in
-- the past): claim_candidates walks it from the oldest ready time.
DROP INDEX objects_ready;
CREATE INDEX objects_ready ON objects (ready_at)
WHERE ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1);
CREATE INDEX objects_due ON objects (
    CASE WHEN lease_expires IS NOT NULL AND lease_expires > ready_at
         THEN lease_expires ELSE ready_at END)
WHERE ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1);
