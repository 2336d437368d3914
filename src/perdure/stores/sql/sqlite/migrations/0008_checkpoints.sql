-- perdure SQLite schema, version 8: slots of superseding state (a resource's latest
-- descriptor, a step's latest progress marker), outside the hash chain on purpose: one
-- row per (object, slot), upserted, so a resume reads the latest value only and the
-- superseded ones are never kept. Each row is signed over the chain head it follows.
CREATE TABLE checkpoints (
    object_id  TEXT NOT NULL,
    slot       TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    after_seq  INTEGER NOT NULL,
    after_hash TEXT NOT NULL,
    body       BLOB NOT NULL,
    signer     TEXT NOT NULL,
    signature  BLOB NOT NULL,
    written_at REAL NOT NULL,
    PRIMARY KEY (object_id, slot)
) WITHOUT ROWID;
