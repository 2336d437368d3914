-- perdure SQLite schema, version 9: a node counts as live until its last heartbeat says
-- (its lease length ahead), and a node that stops cleanly is gone at once.
ALTER TABLE nodes ADD COLUMN live_until REAL;
