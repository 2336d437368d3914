-- perdure PostgreSQL schema, version 10: named queues (perdure.core.flow). An object
-- started on a queue carries its name, its key there, its priority and its dedupe key;
-- queues holds each queue's limits, and its row is locked by the claim that counts the
-- queue's slots (its objects under a live lease), so claims of one queue from many
-- nodes take turns. objects_ready leaves out queued objects: the claim of objects
-- without a queue never reads them. started_at is when an object was first claimed
-- (what a limiter counts).
ALTER TABLE objects
    ADD COLUMN queue TEXT,
    ADD COLUMN queue_key TEXT,
    ADD COLUMN priority INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN started_at DOUBLE PRECISION,
    ADD COLUMN dedupe_key TEXT;
CREATE TABLE queues (
    name               TEXT PRIMARY KEY,
    concurrency        INTEGER,
    per_key            INTEGER,
    worker_concurrency INTEGER,
    rate_limit         INTEGER,
    rate_period        DOUBLE PRECISION,
    priority           BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at         DOUBLE PRECISION NOT NULL
);
DROP INDEX objects_ready;
CREATE INDEX objects_ready ON objects ((ready_at + 0))
WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested) AND queue IS NULL;
CREATE INDEX objects_queued ON objects (queue, priority, ready_at)
WHERE queue IS NOT NULL AND ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
CREATE INDEX objects_queue_ready ON objects (queue, ready_at)
WHERE queue IS NOT NULL AND ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
CREATE INDEX objects_queue_held ON objects (queue, queue_key)
WHERE queue IS NOT NULL AND lease_owner IS NOT NULL;
CREATE INDEX objects_queue_starts ON objects (queue, started_at)
WHERE queue IS NOT NULL AND started_at IS NOT NULL;
CREATE UNIQUE INDEX objects_dedupe ON objects (queue, dedupe_key)
WHERE dedupe_key IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');
