-- perdure PostgreSQL schema, version 3: commit seals (one signature for a commit's records).
CREATE TABLE seals (
    digest    BYTEA PRIMARY KEY,
    node_id   TEXT NOT NULL,
    hashes    BYTEA NOT NULL,
    signature BYTEA NOT NULL
);
