-- perdure PostgreSQL schema, version 7: slots of superseding state (a resource's latest
-- descriptor, a step's latest progress marker), outside the hash chain on purpose: one
-- row per (object, slot), upserted, so a resume reads the latest value only and the
-- superseded ones are never kept. Each row is signed over the chain head it follows.
CREATE TABLE checkpoints (
    object_id  TEXT NOT NULL,
    slot       TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    after_seq  BIGINT NOT NULL,
    after_hash TEXT NOT NULL,
    body       BYTEA NOT NULL,
    signer     TEXT NOT NULL,
    signature  BYTEA NOT NULL,
    written_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (object_id, slot)
);
