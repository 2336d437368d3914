-- Named queries of the SQLite store: one block per `-- name:` line.

-- name: journal_mode_wal
PRAGMA journal_mode=WAL;

-- name: synchronous
-- {level} is FULL, NORMAL, EXTRA or OFF (checked by the store): a pragma takes no
-- parameters.
PRAGMA synchronous={level};

-- name: foreign_keys_on
PRAGMA foreign_keys=ON;

-- name: begin
-- Every write transaction: take the write lock now, so that concurrent processes queue
-- on it (busy timeout) instead of failing when a read turns into a write.
BEGIN IMMEDIATE;

-- name: commit
COMMIT;

-- name: rollback
ROLLBACK;

-- name: savepoint
-- One append of a group commit, undone alone when it is refused.
SAVEPOINT op;

-- name: rollback_to_savepoint
ROLLBACK TO op;

-- name: release
RELEASE op;

-- name: user_version
-- The schema version: the number of the last migration applied.
PRAGMA user_version;

-- name: quick_check
-- The structure of every page of the file (b-trees, free list): one row "ok", or up to
-- 8 rows naming what is wrong. Reads the whole file; no index-against-table check.
PRAGMA quick_check(8);

-- name: set_user_version
-- {version} is a migration's number (a pragma takes no parameters).
PRAGMA user_version={version};

-- name: table_names
SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%';

-- name: table_columns
-- A table's columns in order (cid, name, type, notnull, dflt_value, pk): the schema check
-- compares the names with the migrations'. Every column is read, so that text in the
-- schema that is not UTF-8 (a damaged type, say) is found here.
SELECT * FROM pragma_table_info(?) ORDER BY cid;

-- name: publish_trust
INSERT INTO trust (item_id, kind, body, created_at) VALUES (?, ?, ?, ?)
ON CONFLICT (item_id) DO NOTHING;

-- name: trust_items
SELECT kind, body FROM trust ORDER BY created_at, item_id;

-- name: insert_object
INSERT INTO objects (object_id, agent, agent_version, status, phase, epoch, ready_at,
                     head_seq, head_hash, parent_id, created_at, updated_at, requires)
VALUES (:object_id, :agent, :agent_version, 'ready', 'instantiated', 0, :ready_at,
        :head_seq, :head_hash, :parent_id, :now, :now, :requires)
ON CONFLICT (object_id) DO NOTHING;

-- name: insert_record
INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body,
                     prev_hash, hash, signature)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_seal
INSERT INTO seals (digest, node_id, hashes, signature) VALUES (?, ?, ?, ?)
ON CONFLICT (digest) DO NOTHING;

-- name: seal_by_digest
SELECT digest, node_id, hashes, signature FROM seals WHERE digest = ?;

-- name: get_object
SELECT * FROM objects WHERE object_id = ?;

-- name: list_objects
-- Rows for people, newest first; a filter given as NULL matches every row. The three
-- blocks after this one are the same query led by a filter an index serves: SQLite plans
-- a statement before it sees the values, so each gets the statement that can use it.
SELECT * FROM objects
WHERE (:status IS NULL OR status = :status)
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:parent IS NULL OR parent_id = :parent)
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: list_children
SELECT * FROM objects
WHERE parent_id = :parent
  AND (:status IS NULL OR status = :status)
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: list_by_status
SELECT * FROM objects
WHERE status = :status
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:parent IS NULL OR parent_id = :parent)
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: list_by_agent
SELECT * FROM objects
WHERE agent = :agent
  AND (:status IS NULL OR status = :status)
  AND (:phase IS NULL OR phase = :phase)
  AND (:parent IS NULL OR parent_id = :parent)
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: records_after
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records WHERE object_id = ? AND seq > ? ORDER BY seq;

-- name: record_at
-- One record by its seq (an object's first record says where it was forked from).
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records WHERE object_id = ? AND seq = ?;

-- name: chain_after
-- The claim-time read: the four header strings as one JSON array (few distinct values
-- in one history).
SELECT seq, ts_us, json_array(trace_id, node_id, policy_ref, kind), body, prev_hash, hash,
       signature
FROM records WHERE object_id = ? AND seq > ? ORDER BY seq;

-- name: claim_candidates
-- Objects without a queue (queued ones are queue_candidates', below).
-- Runnable objects this node can serve: its agent@version, its capabilities, not an
-- object that said this node cannot do its next step. Any node may finish a cancel.
-- The objects_ready index (its WHERE is the paused and queue terms below) is walked from the
-- oldest ready time up to now: objects sleeping until later, waiting for an event
-- (no ready time) or paused are never read.
SELECT object_id FROM objects
WHERE ready_at <= :now
  AND (paused = 0 OR cancel_requested = 1) AND queue IS NULL
  AND (lease_expires IS NULL OR lease_expires <= :now)
  AND (cancel_requested = 1 OR (
        (:serves IS NULL
         OR (agent || '@' || agent_version) IN (SELECT value FROM json_each(:serves)))
    AND NOT EXISTS (SELECT 1 FROM json_each(objects.requires) AS r
                    WHERE r.value NOT IN (SELECT value FROM json_each(:caps)))
    AND NOT EXISTS (SELECT 1 FROM json_each(objects.avoid) AS a WHERE a.value = :node)))
ORDER BY ready_at
LIMIT :limit;

-- name: claim_one
UPDATE objects
SET epoch = epoch + 1, lease_owner = :owner, lease_expires = :lease_until,
    status = 'running', phase = 'evaluation', updated_at = :now,
    -- A lease that lapsed instead of being let go: its worker died (or lost the store)
    -- while it ran the object. Deaths at the same head count up; any other claim resets.
    crashes = CASE WHEN lease_owner IS NULL THEN 0
                   WHEN crash_seq = head_seq THEN crashes + 1 ELSE 1 END,
    crash_seq = head_seq
WHERE object_id = :object_id
  AND ready_at <= :now
  AND (lease_expires IS NULL OR lease_expires <= :now)
RETURNING object_id, epoch, lease_expires, cancel_requested, paused, crashes;

-- name: insert_queued_object
-- An object started on a queue. ON CONFLICT without a target: a taken id, or a dedupe
-- key a live object of the queue holds (objects_dedupe), inserts nothing.
INSERT INTO objects (object_id, agent, agent_version, status, phase, epoch, ready_at,
                     head_seq, head_hash, parent_id, created_at, updated_at, requires,
                     queue, queue_key, priority, dedupe_key)
VALUES (:object_id, :agent, :agent_version, 'ready', 'instantiated', 0, :ready_at,
        :head_seq, :head_hash, :parent_id, :now, :now, :requires,
        :queue, :queue_key, :priority, :dedupe_key)
ON CONFLICT DO NOTHING;

-- name: queue_holder
SELECT object_id FROM objects
WHERE queue = ? AND dedupe_key = ? AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: declare_queue
INSERT INTO queues (name, concurrency, per_key, worker_concurrency, rate_limit, rate_period,
                    priority, updated_at)
VALUES (:name, :concurrency, :per_key, :worker_concurrency, :rate_limit, :rate_period,
        :priority, :now)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency,
    per_key = excluded.per_key, worker_concurrency = excluded.worker_concurrency,
    rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
    priority = excluded.priority, updated_at = excluded.updated_at;

-- name: queues
SELECT name, concurrency, per_key, worker_concurrency, rate_limit, rate_period, priority
FROM queues ORDER BY name;

-- name: queue_row
SELECT name, concurrency, per_key, worker_concurrency, rate_limit, rate_period, priority
FROM queues WHERE name = ?;

-- name: queues_ready
-- Queues with an object runnable now that no node holds (objects_queue_ready): the
-- claim visits each of them in turn, in name order, under the write lock.
SELECT q.name FROM queues q
WHERE EXISTS (SELECT 1 FROM objects o
              WHERE o.queue = q.name AND o.ready_at <= :now
                AND (o.paused = 0 OR o.cancel_requested = 1)
                AND (o.lease_expires IS NULL OR o.lease_expires <= :now))
ORDER BY q.name;

-- name: queue_held
-- The queue's slots: its objects under a live lease, per key, and how many of them the
-- claiming worker holds (objects_queue_held).
SELECT queue_key, count(*), sum(lease_owner = :owner)
FROM objects
WHERE queue = :queue AND lease_owner IS NOT NULL AND lease_expires > :now
GROUP BY queue_key;

-- name: queue_started
-- Objects of the queue first claimed within the limiter's period (objects_queue_starts).
SELECT count(*) FROM objects WHERE queue = :queue AND started_at > :since;

-- name: queue_candidates
-- Runnable objects of the queue, in its order (objects asked to cancel first, then by
-- priority, then by ready time): those this node can serve, of keys not at their cap
-- (:full, a JSON list), and, when the limiter is at its limit (:fresh 0), only ones
-- that already started. With no room (:room 0) only objects asked to cancel.
SELECT object_id, queue_key, started_at IS NULL, cancel_requested FROM objects
WHERE queue = :queue AND ready_at <= :now
  AND (paused = 0 OR cancel_requested = 1)
  AND (lease_expires IS NULL OR lease_expires <= :now)
  AND (cancel_requested = 1 OR (
        :room
    AND (:fresh OR started_at IS NOT NULL)
    AND (queue_key IS NULL OR queue_key NOT IN (SELECT value FROM json_each(:full)))
    AND (:serves IS NULL
         OR (agent || '@' || agent_version) IN (SELECT value FROM json_each(:serves)))
    AND NOT EXISTS (SELECT 1 FROM json_each(objects.requires) AS r
                    WHERE r.value NOT IN (SELECT value FROM json_each(:caps)))
    AND NOT EXISTS (SELECT 1 FROM json_each(objects.avoid) AS a WHERE a.value = :node)))
ORDER BY cancel_requested DESC, priority, ready_at, object_id
LIMIT :scan;

-- name: claim_queued_one
-- claim_one for an object of a queue: started_at keeps the first claim's time.
UPDATE objects
SET epoch = epoch + 1, lease_owner = :owner, lease_expires = :lease_until,
    status = 'running', phase = 'evaluation', updated_at = :now,
    crashes = CASE WHEN lease_owner IS NULL THEN 0
                   WHEN crash_seq = head_seq THEN crashes + 1 ELSE 1 END,
    crash_seq = head_seq,
    started_at = COALESCE(started_at, :now)
WHERE object_id = :object_id
  AND ready_at <= :now
  AND (lease_expires IS NULL OR lease_expires <= :now)
RETURNING object_id, epoch, lease_expires, cancel_requested, paused, crashes;

-- name: queue_stats
-- Each queue's limits, its slots held, its objects runnable and not held, its dormant
-- ones (neither held nor runnable, not terminal), and its starts within the period.
WITH counts AS (
    SELECT queue,
           sum(CASE WHEN lease_owner IS NOT NULL AND lease_expires > :now
                    THEN 1 ELSE 0 END) AS held,
           sum(CASE WHEN (lease_owner IS NULL OR lease_expires <= :now)
                         AND ready_at <= :now AND (paused = 0 OR cancel_requested = 1)
                    THEN 1 ELSE 0 END) AS ready,
           count(*) AS live
    FROM objects
    WHERE queue IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')
    GROUP BY queue
)
SELECT q.name, q.concurrency, q.per_key, q.worker_concurrency, q.rate_limit, q.rate_period,
       q.priority, COALESCE(c.held, 0), COALESCE(c.ready, 0),
       COALESCE(c.live - c.held - c.ready, 0),
       CASE WHEN q.rate_period IS NULL THEN 0 ELSE (
           SELECT count(*) FROM objects s
           WHERE s.queue = q.name AND s.started_at > :now - q.rate_period) END
FROM queues q LEFT JOIN counts c ON c.queue = q.name
ORDER BY q.name;

-- name: renew
UPDATE objects SET lease_expires = :lease_until
WHERE object_id = :object_id AND epoch = :epoch AND lease_owner IS NOT NULL
RETURNING object_id, epoch, lease_expires, cancel_requested, paused, crashes;

-- name: append_update
UPDATE objects
SET head_seq = COALESCE(:head_seq, head_seq),
    head_hash = COALESCE(:head_hash, head_hash),
    status = :status,
    phase = :phase,
    ready_at = CASE
        -- A cancel asked for while the node ran must not be lost when it lets go.
        WHEN cancel_requested = 1 AND :status NOT IN ('completed', 'failed', 'cancelled')
        THEN :now
        WHEN :waiting_event IS NOT NULL AND EXISTS (
            SELECT 1 FROM inbox
            WHERE inbox.object_id = :object_id
              -- an update request (perdure:update) wakes a wait for an event of the
              -- agent's own (a run.wait_for, which takes updates); perdure's own waits
              -- (children, approvals, schedules) take none, and are not woken for one
              AND (inbox.name = :waiting_event
                   OR (inbox.name = 'perdure:update' AND :waiting_event NOT LIKE 'perdure:%'))
              AND inbox.consumed_seq IS NULL
              -- not one this append consumes (a JSON list): it is taken, not pending
              AND inbox.event_id NOT IN (SELECT value FROM json_each(:consumed)))
        THEN :now
        ELSE :ready_at END,
    waiting_event = :waiting_event,
    result = COALESCE(:result, result),
    lease_owner = CASE WHEN :release THEN NULL ELSE lease_owner END,
    lease_expires = CASE WHEN :release THEN NULL ELSE lease_expires END,
    parked = :parked,
    note = :note,
    requires = COALESCE(:requires, requires),
    avoid = CASE WHEN :clear_avoid THEN '[]'
                 WHEN :avoid_node IS NOT NULL THEN json_insert(avoid, '$[#]', :avoid_node)
                 ELSE avoid END,
    updated_at = :now
WHERE object_id = :object_id AND epoch = :epoch
  AND (:expected_head IS NULL OR head_seq = :expected_head)
  -- Nothing is appended to memory that holds its terminal record.
  AND (:head_seq IS NULL OR status NOT IN ('completed', 'failed', 'cancelled'))
  -- A completion is refused while a cancel is pending: the node writes the cancel instead.
  AND (:unless_cancelled = 0 OR cancel_requested = 0)
RETURNING cancel_requested;

-- name: append_step
-- The common append, a record added while the node runs the object: when the row
-- already holds every value append_update would set, only the head moves. This
-- leaves the indexed columns (and their index pages) untouched, so the commit writes
-- the record page and the row page. No row back: the caller runs append_update.
UPDATE objects
SET head_seq = :head_seq,
    head_hash = :head_hash,
    updated_at = :now
WHERE object_id = :object_id AND epoch = :epoch AND head_seq = :expected_head
  AND status = :status AND phase = :phase AND ready_at IS :ready_at
  AND waiting_event IS NULL AND parked = 0 AND note IS NULL AND cancel_requested = 0;

-- name: append_steps
-- append_step for many objects in one statement ({rows} is that many "(?,?,?,?,?,?,?,?)"):
-- SQLite gives up the GIL once per statement it runs, not once per row.
WITH v (object_id, head_seq, head_hash, epoch, expected_head, status, phase, ready_at)
    AS (VALUES {rows})
UPDATE objects
SET head_seq = v.head_seq, head_hash = v.head_hash, updated_at = ?
FROM v
WHERE objects.object_id = v.object_id AND objects.epoch = v.epoch
  AND objects.head_seq = v.expected_head
  AND objects.status = v.status AND objects.phase = v.phase AND objects.ready_at IS v.ready_at
  AND objects.waiting_event IS NULL AND objects.parked = 0 AND objects.note IS NULL
  AND objects.cancel_requested = 0;

-- name: heads_of
-- The heads of the given objects ({marks} is that many "?").
SELECT object_id, head_seq, head_hash FROM objects WHERE object_id IN ({marks});

-- name: insert_records
-- insert_record for many records in one statement ({rows} is that many
-- "(?,?,?,?,?,?,?,?,?,?,?)").
INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body,
                     prev_hash, hash, signature)
VALUES {rows};

-- name: cancel_state
SELECT epoch, cancel_requested FROM objects WHERE object_id = ?;

-- name: consume_event
UPDATE inbox SET consumed_seq = ? WHERE event_id = ? AND object_id = ? AND consumed_seq IS NULL;

-- name: object_status
SELECT status FROM objects WHERE object_id = ?;

-- name: debounce_row
SELECT status, dedupe_key, started_at FROM objects WHERE object_id = ?;

-- name: debounce_release
-- A debounced object that started gives its key up (objects_dedupe): the next start
-- with it makes a new object.
UPDATE objects SET dedupe_key = NULL WHERE object_id = ? AND dedupe_key = ?;

-- name: debounce_push
-- A debounced object not claimed yet waits for the quiet period again (not one asked
-- to cancel: its end is due now).
UPDATE objects SET ready_at = :ready_at, updated_at = :now
WHERE object_id = :object_id AND cancel_requested = 0;

-- name: insert_event
INSERT INTO inbox (object_id, name, payload, dedupe_key, sent_at, seal)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (object_id, dedupe_key) DO NOTHING;

-- name: wake_for_event
-- Wakes an object waiting for this event; a control event (``perdure:`` prefix) wakes any.
UPDATE objects SET ready_at = :now
WHERE object_id = :object_id AND lease_owner IS NULL
  AND (waiting_event = :name OR substr(:name, 1, 8) = 'perdure:')
  AND (ready_at IS NULL OR ready_at > :now)
  AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: pending_events
SELECT event_id, object_id, name, payload, dedupe_key, sent_at, seal FROM inbox
WHERE object_id = ? AND consumed_seq IS NULL ORDER BY event_id;

-- name: set_paused
UPDATE objects SET paused = :paused, updated_at = :now,
                   status = CASE WHEN :paused = 0 AND status = 'paused' THEN 'ready' ELSE status END
WHERE object_id = :object_id;

-- name: request_cancel
UPDATE objects SET cancel_requested = 1, ready_at = COALESCE(MIN(ready_at, :now), :now),
                   updated_at = :now
WHERE object_id = :object_id;

-- name: cancel_children
-- A parent that terminates asks its live children to cancel, in the same transaction.
UPDATE objects SET cancel_requested = 1, ready_at = COALESCE(MIN(ready_at, :now), :now),
                   updated_at = :now
WHERE parent_id = :object_id AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: unpark
UPDATE objects SET parked = 0, note = NULL, ready_at = :now, status = 'ready', updated_at = :now,
                   crashes = 0
WHERE object_id = :object_id AND parked = 1;

-- name: next_ready_at
-- When the next object becomes claimable: its ready time, or its lease expiry if later.
-- The objects_due index holds exactly this expression under exactly this WHERE (keep
-- them the same): the answer is its first entry, however many objects sleep.
SELECT MIN(CASE WHEN lease_expires IS NOT NULL AND lease_expires > ready_at
                THEN lease_expires ELSE ready_at END)
FROM objects WHERE ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1);

-- name: leases_held
SELECT object_id, lease_owner, epoch FROM objects
WHERE lease_owner LIKE :prefix ESCAPE '\' AND lease_expires > :now;

-- name: expire_lease
UPDATE objects SET lease_expires = :now, updated_at = :now
WHERE object_id = :object_id AND epoch = :epoch AND lease_owner = :owner;

-- name: control_flags
-- {marks} is one "?" per object id.
SELECT object_id, epoch, cancel_requested, paused FROM objects WHERE object_id IN ({marks});

-- name: heartbeat
-- A node counts as live until live_until (its lease length ahead) unless it beats again.
INSERT INTO nodes (node_id, public_key, created_at, serves, capabilities, seen_at, live_until)
VALUES (:node_id, :public_key, :now, :serves, :caps, :now, :live_until)
ON CONFLICT (node_id) DO UPDATE SET public_key = excluded.public_key,
    serves = excluded.serves, capabilities = excluded.capabilities,
    seen_at = excluded.seen_at, live_until = excluded.live_until;

-- name: node_gone
-- A node that stopped cleanly is gone at once, not when its last heartbeat runs out.
UPDATE nodes SET live_until = :now WHERE node_id = :node_id AND live_until > :now;

-- name: live_nodes
SELECT node_id, serves, capabilities, seen_at, live_until FROM nodes
WHERE live_until IS NOT NULL AND live_until > :now ORDER BY node_id;

-- name: data_key
SELECT object_id, key_id, wrapped, seal_all FROM data_keys WHERE object_id = ?;

-- name: put_data_key
-- The first data key of an object stays: a second writer (another node starting or
-- sealing for the same object at the same moment) reads the first one back.
INSERT INTO data_keys (object_id, key_id, wrapped, seal_all, updated_at)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT (object_id) DO NOTHING;

-- name: data_keys_not_under
SELECT object_id, key_id, wrapped, seal_all FROM data_keys
WHERE key_id <> ? AND object_id > ? ORDER BY object_id LIMIT ?;

-- name: rewrap_data_key
-- Compare-and-set: only a row still wrapped under the key it was read under.
UPDATE data_keys SET key_id = ?, wrapped = ?, updated_at = ?
WHERE object_id = ? AND key_id = ? AND wrapped = ?;

-- name: data_key_counts
SELECT key_id, count(*) FROM data_keys GROUP BY key_id ORDER BY key_id;

-- name: put_checkpoint
-- Fenced like an append: only while the object's row still has the writer's epoch and a
-- lease owner. One row per (object, slot): the latest value replaces the one before.
INSERT INTO checkpoints (object_id, slot, epoch, after_seq, after_hash, body, signer,
                         signature, written_at)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9
WHERE EXISTS (SELECT 1 FROM objects WHERE object_id = ?1 AND epoch = ?3
                                      AND lease_owner IS NOT NULL)
ON CONFLICT (object_id, slot) DO UPDATE SET
    epoch = excluded.epoch, after_seq = excluded.after_seq,
    after_hash = excluded.after_hash, body = excluded.body, signer = excluded.signer,
    signature = excluded.signature, written_at = excluded.written_at;

-- name: checkpoints
SELECT object_id, slot, epoch, after_seq, after_hash, body, signer, signature, written_at
FROM checkpoints WHERE object_id = ? ORDER BY slot;

-- name: checkpoint_fence
SELECT 1 FROM objects WHERE object_id = ? AND epoch = ? AND lease_owner IS NOT NULL;

-- name: delete_checkpoint
DELETE FROM checkpoints WHERE object_id = ? AND slot = ?;

-- name: delete_checkpoints
DELETE FROM checkpoints WHERE object_id = ?;


-- name: browse_objects
-- The dashboard's objects, newest first by (created_at, object_id), one page after the
-- key (:c_at, :c_id) (NULL: the first page). The key is also a range on created_at, so
-- the objects_created index serves page 1,000 as it serves page 1 (never an offset).
-- A filter given as NULL matches every row. :status is a stored status or one derived
-- from the flags: parked; paused (and not parked); running (a lease live at :now); a
-- stored status that is not terminal matches rows neither parked nor paused. :node
-- holds the lease now (owners are "node/worker"); :q is the start of the id, compared
-- exactly (no LIKE: an id may hold % or _); :lk = :lv is a label the object was started
-- with (its first record's context; read with json_each, as a JSON path cannot name
-- every key). The four blocks after this one are this query led
-- by one more predicate that an index serves (the id's primary key range, a parent,
-- a stored status, an agent): SQLite plans a statement before it sees the values, so
-- each gets the statement that can use its index. They must stay this query otherwise
-- (tests/stores/test_browse.py holds them to it).
SELECT * FROM objects
WHERE created_at <= COALESCE(:until, 1e300)
  AND created_at >= COALESCE(:since, -1e300)
  AND created_at <= COALESCE(:c_at, 1e300)
  AND (:c_at IS NULL OR created_at < :c_at OR object_id > :c_id)
  AND (:status IS NULL
       OR (:status = 'parked' AND parked = 1)
       OR (:status = 'paused' AND paused = 1 AND parked = 0)
       OR (:status = 'running' AND lease_owner IS NOT NULL AND lease_expires > :now)
       OR (:status NOT IN ('parked', 'paused', 'running') AND status = :status
           AND (status IN ('completed', 'failed', 'cancelled')
                OR (parked = 0 AND paused = 0))))
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR agent_version = :version)
  AND (:parent IS NULL OR parent_id = :parent)
  AND (:node IS NULL OR (substr(lease_owner, 1, length(:node) + 1) = :node || '/'
                         AND lease_expires > :now))
  AND (:q IS NULL OR substr(object_id, 1, length(:q)) = :q)
  AND (:lk IS NULL OR EXISTS (
        SELECT 1 FROM records r, json_each(CAST(r.body AS TEXT), '$.context.labels') l
        WHERE r.object_id = objects.object_id AND r.seq = 1 AND r.kind = 'instantiated'
          AND l.key = :lk AND l.value = :lv))
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: browse_by_prefix
-- char(1114111) is U+10FFFF, the greatest character: the range holds every id that
-- starts with :q. likelihood() tells the planner that few ids are in it; it would
-- otherwise keep to the objects_created index for its order, and scan it all.
SELECT * FROM objects
WHERE likelihood(object_id >= :q, 0.001) AND object_id < :q || char(1114111)
  AND created_at <= COALESCE(:until, 1e300)
  AND created_at >= COALESCE(:since, -1e300)
  AND created_at <= COALESCE(:c_at, 1e300)
  AND (:c_at IS NULL OR created_at < :c_at OR object_id > :c_id)
  AND (:status IS NULL
       OR (:status = 'parked' AND parked = 1)
       OR (:status = 'paused' AND paused = 1 AND parked = 0)
       OR (:status = 'running' AND lease_owner IS NOT NULL AND lease_expires > :now)
       OR (:status NOT IN ('parked', 'paused', 'running') AND status = :status
           AND (status IN ('completed', 'failed', 'cancelled')
                OR (parked = 0 AND paused = 0))))
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR agent_version = :version)
  AND (:parent IS NULL OR parent_id = :parent)
  AND (:node IS NULL OR (substr(lease_owner, 1, length(:node) + 1) = :node || '/'
                         AND lease_expires > :now))
  AND (:q IS NULL OR substr(object_id, 1, length(:q)) = :q)
  AND (:lk IS NULL OR EXISTS (
        SELECT 1 FROM records r, json_each(CAST(r.body AS TEXT), '$.context.labels') l
        WHERE r.object_id = objects.object_id AND r.seq = 1 AND r.kind = 'instantiated'
          AND l.key = :lk AND l.value = :lv))
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: browse_children
SELECT * FROM objects
WHERE parent_id = :parent
  AND created_at <= COALESCE(:until, 1e300)
  AND created_at >= COALESCE(:since, -1e300)
  AND created_at <= COALESCE(:c_at, 1e300)
  AND (:c_at IS NULL OR created_at < :c_at OR object_id > :c_id)
  AND (:status IS NULL
       OR (:status = 'parked' AND parked = 1)
       OR (:status = 'paused' AND paused = 1 AND parked = 0)
       OR (:status = 'running' AND lease_owner IS NOT NULL AND lease_expires > :now)
       OR (:status NOT IN ('parked', 'paused', 'running') AND status = :status
           AND (status IN ('completed', 'failed', 'cancelled')
                OR (parked = 0 AND paused = 0))))
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR agent_version = :version)
  AND (:parent IS NULL OR parent_id = :parent)
  AND (:node IS NULL OR (substr(lease_owner, 1, length(:node) + 1) = :node || '/'
                         AND lease_expires > :now))
  AND (:q IS NULL OR substr(object_id, 1, length(:q)) = :q)
  AND (:lk IS NULL OR EXISTS (
        SELECT 1 FROM records r, json_each(CAST(r.body AS TEXT), '$.context.labels') l
        WHERE r.object_id = objects.object_id AND r.seq = 1 AND r.kind = 'instantiated'
          AND l.key = :lk AND l.value = :lv))
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: browse_by_status
SELECT * FROM objects
WHERE status = :status
  AND created_at <= COALESCE(:until, 1e300)
  AND created_at >= COALESCE(:since, -1e300)
  AND created_at <= COALESCE(:c_at, 1e300)
  AND (:c_at IS NULL OR created_at < :c_at OR object_id > :c_id)
  AND (:status IS NULL
       OR (:status = 'parked' AND parked = 1)
       OR (:status = 'paused' AND paused = 1 AND parked = 0)
       OR (:status = 'running' AND lease_owner IS NOT NULL AND lease_expires > :now)
       OR (:status NOT IN ('parked', 'paused', 'running') AND status = :status
           AND (status IN ('completed', 'failed', 'cancelled')
                OR (parked = 0 AND paused = 0))))
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR agent_version = :version)
  AND (:parent IS NULL OR parent_id = :parent)
  AND (:node IS NULL OR (substr(lease_owner, 1, length(:node) + 1) = :node || '/'
                         AND lease_expires > :now))
  AND (:q IS NULL OR substr(object_id, 1, length(:q)) = :q)
  AND (:lk IS NULL OR EXISTS (
        SELECT 1 FROM records r, json_each(CAST(r.body AS TEXT), '$.context.labels') l
        WHERE r.object_id = objects.object_id AND r.seq = 1 AND r.kind = 'instantiated'
          AND l.key = :lk AND l.value = :lv))
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: browse_by_agent
SELECT * FROM objects
WHERE agent = :agent
  AND created_at <= COALESCE(:until, 1e300)
  AND created_at >= COALESCE(:since, -1e300)
  AND created_at <= COALESCE(:c_at, 1e300)
  AND (:c_at IS NULL OR created_at < :c_at OR object_id > :c_id)
  AND (:status IS NULL
       OR (:status = 'parked' AND parked = 1)
       OR (:status = 'paused' AND paused = 1 AND parked = 0)
       OR (:status = 'running' AND lease_owner IS NOT NULL AND lease_expires > :now)
       OR (:status NOT IN ('parked', 'paused', 'running') AND status = :status
           AND (status IN ('completed', 'failed', 'cancelled')
                OR (parked = 0 AND paused = 0))))
  AND (:phase IS NULL OR phase = :phase)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR agent_version = :version)
  AND (:parent IS NULL OR parent_id = :parent)
  AND (:node IS NULL OR (substr(lease_owner, 1, length(:node) + 1) = :node || '/'
                         AND lease_expires > :now))
  AND (:q IS NULL OR substr(object_id, 1, length(:q)) = :q)
  AND (:lk IS NULL OR EXISTS (
        SELECT 1 FROM records r, json_each(CAST(r.body AS TEXT), '$.context.labels') l
        WHERE r.object_id = objects.object_id AND r.seq = 1 AND r.kind = 'instantiated'
          AND l.key = :lk AND l.value = :lv))
ORDER BY created_at DESC, object_id
LIMIT :limit;

-- name: records_of_kinds
-- An object's records of some kinds (:kinds, a JSON array), oldest first: its intent and
-- refinements, when its memory is too long to read whole for a page.
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records
WHERE object_id = :object_id AND kind IN (SELECT value FROM json_each(:kinds))
ORDER BY seq
LIMIT :limit;

-- name: status_counts
SELECT status, COUNT(*) FROM objects GROUP BY status;

-- name: object_counts
-- Per agent and shown status (parked, then paused, else the stored one): how many, and
-- how many of them wait for a decision on a tool call.
SELECT agent,
       CASE WHEN parked THEN 'parked' WHEN paused THEN 'paused' ELSE status END AS shown,
       COUNT(*),
       SUM(CASE WHEN waiting_event = 'perdure:approval' THEN 1 ELSE 0 END)
FROM objects
GROUP BY agent, shown;

-- name: awaiting_outside
-- Questions for people: dormant objects no node holds, waiting for an event that is not
-- one of perdure's own (perdure:...), most recently updated first.
SELECT * FROM objects
WHERE waiting_event IS NOT NULL AND lease_owner IS NULL
  AND waiting_event NOT LIKE 'perdure:%' AND status = 'dormant'
ORDER BY updated_at DESC, object_id
LIMIT :limit;

-- name: lease_holders
SELECT object_id, lease_owner FROM objects
WHERE lease_owner IS NOT NULL AND lease_expires > :now
ORDER BY object_id
LIMIT :limit;

-- name: queue_key_holders
-- The keys of a queue holding slots now, most first (objects_queue_held).
SELECT queue_key, count(*) AS held FROM objects
WHERE queue = :queue AND lease_owner IS NOT NULL AND lease_expires > :now
GROUP BY queue_key
ORDER BY held DESC, queue_key IS NOT NULL, queue_key
LIMIT :limit;

-- name: ended_since
SELECT status, updated_at FROM objects
WHERE updated_at >= :since AND status IN ('completed', 'failed', 'cancelled');

-- name: updated_since
SELECT object_id FROM objects
WHERE updated_at >= :since
ORDER BY updated_at DESC, object_id
LIMIT :limit;

-- name: bodies_since
-- Records of some objects (:ids) and kinds (:kinds), both JSON arrays, written since
-- :since_us: the last hour's spend and wake latency.
SELECT object_id, seq, kind, ts_us, body FROM records
WHERE object_id IN (SELECT value FROM json_each(:ids)) AND ts_us >= :since_us
  AND kind IN (SELECT value FROM json_each(:kinds))
ORDER BY object_id, seq;

-- name: sent_at
-- When some inbox events (:ids, a JSON array) were sent.
SELECT event_id, sent_at FROM inbox WHERE event_id IN (SELECT value FROM json_each(:ids));

-- name: declare_model_quota
-- A quota's limits (what 429s taught is kept).
INSERT INTO model_quotas (provider, model, tokens_per_minute, requests_per_minute,
                          window_seconds, updated_at)
VALUES (:provider, :model, :tokens_per_minute, :requests_per_minute, :window, :now)
ON CONFLICT (provider, model) DO UPDATE SET
    tokens_per_minute = excluded.tokens_per_minute,
    requests_per_minute = excluded.requests_per_minute,
    window_seconds = excluded.window_seconds, updated_at = excluded.updated_at;

-- name: model_quota_row
SELECT provider, model, tokens_per_minute, requests_per_minute, window_seconds, factor,
       adapted_at, blocked_until, throttles, throttled_at
FROM model_quotas WHERE provider = :provider AND model = :model;

-- name: model_quotas
SELECT provider, model, tokens_per_minute, requests_per_minute, window_seconds, factor,
       adapted_at, blocked_until, throttles, throttled_at
FROM model_quotas ORDER BY provider, model;

-- name: quota_prune
-- Reservations that left the quota's window.
DELETE FROM quota_reservations
WHERE provider = :provider AND model = :model AND at <= :since
  AND (settled = 1 OR NOT EXISTS (SELECT 1 FROM objects o
                                  WHERE o.object_id = quota_reservations.object_id
                                    AND o.lease_owner IS NOT NULL AND o.lease_expires > :now));

-- name: quota_window
-- A call in flight counts while its object's lease is live, however long it takes.
SELECT r.at, r.tokens, r.settled FROM quota_reservations r
LEFT JOIN objects o ON o.object_id = r.object_id
WHERE r.provider = :provider AND r.model = :model
  AND (r.at > :since OR (r.settled = 0 AND o.lease_owner IS NOT NULL AND o.lease_expires > :now));

-- name: quota_reserve
INSERT INTO quota_reservations (provider, model, object_id, holder, tokens, at)
VALUES (:provider, :model, :object_id, :holder, :tokens, :now)
RETURNING ticket;

-- name: quota_settle
-- What the provider reported, counted from when the reply came.
UPDATE quota_reservations SET tokens = :tokens, at = max(at, :now), settled = 1
WHERE ticket = :ticket;

-- name: quota_adapt
UPDATE model_quotas SET factor = :factor, adapted_at = :adapted_at,
    blocked_until = :blocked_until, throttles = :throttles, throttled_at = :throttled_at
WHERE provider = :provider AND model = :model;

-- name: alert_fire
-- Fire unless firing already: the row comes back only to the write that fired it.
INSERT INTO alerts (rule, subject, state, summary, node_id, fired_at, changed_at)
VALUES (:rule, :subject, 'firing', :summary, :node_id, :now, :now)
ON CONFLICT (rule, subject) DO UPDATE
SET state = 'firing', summary = excluded.summary, node_id = excluded.node_id,
    fired_at = excluded.fired_at, resolved_at = NULL, changed_at = excluded.changed_at
WHERE alerts.state <> 'firing'
RETURNING rule;

-- name: alert_resolve
-- Resolve if firing: the row comes back only to the write that resolved it.
UPDATE alerts SET state = 'resolved', resolved_at = :now, changed_at = :now
WHERE rule = :rule AND subject = :subject AND state = 'firing'
RETURNING rule, subject, state, summary, node_id, fired_at, resolved_at;

-- name: alerts
SELECT rule, subject, state, summary, node_id, fired_at, resolved_at FROM alerts
WHERE (CAST(:state AS TEXT) IS NULL OR state = :state)
  AND substr(rule, 1, length(:prefix)) = :prefix
ORDER BY changed_at DESC, rule, subject
LIMIT :limit;
