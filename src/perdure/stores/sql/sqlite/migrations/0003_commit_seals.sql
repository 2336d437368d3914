-- perdure SQLite schema, version 3: commit seals (one signature for a commit's records).
CREATE TABLE seals (
    digest    BLOB PRIMARY KEY,
    node_id   TEXT NOT NULL,
    hashes    BLOB NOT NULL,
    signature BLOB NOT NULL
) WITHOUT ROWID;
