-- perdure SQLite schema, version 13: alerts and notifications (perdure.telemetry.alerts).
-- One row per (rule, subject): every node evaluating a rule writes it conditionally
-- (fire only what is not firing, resolve only what is), so exactly one node's write
-- wins each change and only that node delivers it.
CREATE TABLE alerts (
    rule        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    state       TEXT NOT NULL,
    summary     TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    fired_at    REAL NOT NULL,
    resolved_at REAL,
    changed_at  REAL NOT NULL,
    PRIMARY KEY (rule, subject)
) WITHOUT ROWID;
CREATE INDEX alerts_changed ON alerts (changed_at);
