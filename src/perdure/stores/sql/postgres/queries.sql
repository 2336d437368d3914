-- Named queries of the PostgreSQL store: one block per `-- name:` line.
-- Lease times are decided by the database clock (db_now below); timers (ready_at)
-- are the nodes' wall-clock times.

-- name: idle_tx_timeout
-- Per connection: the server ends a session left idle inside a transaction after this
-- many milliseconds (a frozen node's), so that its row locks do not block other nodes.
SELECT set_config('idle_in_transaction_session_timeout', %s, false);

-- name: migration_lock
-- Held until the migrating transaction ends: nodes starting at once migrate in turn.
SELECT pg_advisory_xact_lock(%s);

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS perdure_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now());

-- name: applied_migrations
SELECT version FROM perdure_migrations;

-- name: note_migration
INSERT INTO perdure_migrations (version, name) VALUES (%s, %s);

-- name: listen
-- The wake-up channel: pg_notify('perdure_wake', object_id) below wakes idle nodes.
LISTEN perdure_wake;

-- name: listen_ended
-- The results channel: ``notify_ended`` tells callers waiting for a result.
LISTEN perdure_ended;

-- name: notify_ended
-- Objects that ended or were parked, told after their commit in a transaction of its own
-- (the group commit's transaction never queues on the notification lock for them).
SELECT pg_notify('perdure_ended', id) FROM unnest(%s::text[]) AS id;

-- name: publish_trust
INSERT INTO trust (item_id, kind, body, created_at) VALUES (%s, %s, %s, %s)
ON CONFLICT (item_id) DO NOTHING;

-- name: trust_items
SELECT kind, body FROM trust ORDER BY created_at, item_id;

-- name: insert_object
INSERT INTO objects (object_id, agent, agent_version, status, phase, epoch, ready_at,
                     head_seq, head_hash, parent_id, created_at, updated_at, requires)
VALUES (%(object_id)s, %(agent)s, %(agent_version)s, 'ready', 'instantiated', 0, %(ready_at)s,
        %(head_seq)s, %(head_hash)s, %(parent_id)s, %(now)s, %(now)s, %(requires)s)
ON CONFLICT (object_id) DO NOTHING;

-- name: insert_record
INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body,
                     prev_hash, hash, signature)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: insert_seals
-- The commit seals of a group commit (one JSON object each, bytea as base64).
INSERT INTO seals (digest, node_id, hashes, signature)
SELECT decode(s.digest, 'base64'), s.node_id, decode(s.hashes, 'base64'),
       decode(s.signature, 'base64')
FROM jsonb_to_recordset(%(seals)s::jsonb) AS s(
    digest text, node_id text, hashes text, signature text)
ON CONFLICT (digest) DO NOTHING;

-- name: seals_by_digest
SELECT digest, node_id, hashes, signature FROM seals WHERE digest = ANY(%s);

-- name: get_object
SELECT * FROM objects WHERE object_id = %s;

-- name: list_objects
-- Rows for people, newest first; a filter given as NULL matches every row. The three
-- blocks after this one are the same query led by a filter an index serves, as in
-- SQLite's queries (where the planner needs them).
SELECT * FROM objects
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(phase)s::text IS NULL OR phase = %(phase)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s)
ORDER BY created_at DESC, object_id
LIMIT %(limit)s;

-- name: list_children
SELECT * FROM objects
WHERE parent_id = %(parent)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(phase)s::text IS NULL OR phase = %(phase)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
ORDER BY created_at DESC, object_id
LIMIT %(limit)s;

-- name: list_by_status
SELECT * FROM objects
WHERE status = %(status)s
  AND (%(phase)s::text IS NULL OR phase = %(phase)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s)
ORDER BY created_at DESC, object_id
LIMIT %(limit)s;

-- name: list_by_agent
SELECT * FROM objects
WHERE agent = %(agent)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(phase)s::text IS NULL OR phase = %(phase)s)
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s)
ORDER BY created_at DESC, object_id
LIMIT %(limit)s;

-- name: records_after
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records WHERE object_id = %s AND seq > %s ORDER BY seq;

-- name: record_at
-- One record by its seq (an object's first record says where it was forked from).
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records WHERE object_id = %s AND seq = %s;

-- name: chain_after
-- The claim-time read: the four header strings as one value (few distinct values in
-- one history), joined with U+001F (the columns are TEXT NOT NULL).
SELECT seq, ts_us, concat_ws(chr(31), trace_id, node_id, policy_ref, kind), body,
       prev_hash, hash, signature
FROM records WHERE object_id = %s AND seq > %s ORDER BY seq;

-- name: claim
-- Objects without a queue (queued ones are claim_queued's, below).
-- The objects_ready index (its WHERE is the paused and queue terms below) serves the candidates
-- from the oldest ready time up to now: objects sleeping until later, waiting for an
-- event (no ready time) or paused are never read. It indexes ready_at + 0, not the
-- column: ANALYZE keeps statistics of an index expression over the index's own rows,
-- so the planner knows how few unpaused objects are due (paused ones keep a ready time
-- in the past: counted in, they make a scan of all of objects_due look cheaper).
WITH db AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now),
candidates AS (
    SELECT o.object_id FROM objects o, db
    WHERE o.ready_at + 0 <= %(now)s
      AND (o.paused = FALSE OR o.cancel_requested) AND o.queue IS NULL
      AND (o.lease_expires IS NULL OR o.lease_expires <= db.now)
      AND (o.cancel_requested OR (
            (%(serves)s::text[] IS NULL
             OR (o.agent || '@' || o.agent_version) = ANY(%(serves)s::text[]))
        AND o.requires <@ %(caps)s::text[]
        AND NOT (%(node)s::text = ANY(o.avoid))))
    ORDER BY o.ready_at + 0
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE objects o
SET epoch = o.epoch + 1, lease_owner = %(owner)s, lease_expires = db.now + %(lease)s,
    status = 'running', phase = 'evaluation', updated_at = %(now)s,
    -- A lease that lapsed instead of being let go: its worker died (or lost the store)
    -- while it ran the object. Deaths at the same head count up; any other claim resets.
    crashes = CASE WHEN o.lease_owner IS NULL THEN 0
                   WHEN o.crash_seq = o.head_seq THEN o.crashes + 1 ELSE 1 END,
    crash_seq = o.head_seq
FROM candidates c, db
WHERE o.object_id = c.object_id
RETURNING o.object_id, o.epoch, o.lease_expires, o.cancel_requested, o.paused, o.crashes;

-- name: insert_queued_object
-- An object started on a queue. ON CONFLICT without a target: a taken id, or a dedupe
-- key a live object of the queue holds (objects_dedupe), inserts nothing.
INSERT INTO objects (object_id, agent, agent_version, status, phase, epoch, ready_at,
                     head_seq, head_hash, parent_id, created_at, updated_at, requires,
                     queue, queue_key, priority, dedupe_key)
VALUES (%(object_id)s, %(agent)s, %(agent_version)s, 'ready', 'instantiated', 0, %(ready_at)s,
        %(head_seq)s, %(head_hash)s, %(parent_id)s, %(now)s, %(now)s, %(requires)s,
        %(queue)s, %(queue_key)s, %(priority)s, %(dedupe_key)s)
ON CONFLICT DO NOTHING;

-- name: queue_holder
SELECT object_id FROM objects
WHERE queue = %s AND dedupe_key = %s AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: declare_queue
-- The queue's limits (the caller read those it replaces with queue_lock first).
INSERT INTO queues (name, concurrency, per_key, worker_concurrency, rate_limit, rate_period,
                    priority, updated_at)
VALUES (%(name)s, %(concurrency)s, %(per_key)s, %(worker_concurrency)s, %(rate_limit)s,
        %(rate_period)s, %(priority)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency,
    per_key = excluded.per_key, worker_concurrency = excluded.worker_concurrency,
    rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
    priority = excluded.priority, updated_at = excluded.updated_at;

-- name: queues
SELECT name, concurrency, per_key, worker_concurrency, rate_limit, rate_period, priority
FROM queues ORDER BY name;

-- name: queues_any
-- Whether any queue was ever declared (the table only grows): until one is, a claim
-- does not look for queued work.
SELECT EXISTS (SELECT 1 FROM queues);

-- name: queues_ready
-- Queues with an object runnable now that no node holds (objects_queue_ready): the
-- claim visits each of them in turn, in name order.
WITH db AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now)
SELECT q.name FROM queues q
WHERE EXISTS (SELECT 1 FROM objects o, db
              WHERE o.queue = q.name AND o.ready_at <= %(now)s
                AND (o.paused = FALSE OR o.cancel_requested)
                AND (o.lease_expires IS NULL OR o.lease_expires <= db.now))
ORDER BY q.name;

-- name: queue_lock
-- Held until the claim's transaction ends: claims of one queue from every node take
-- turns counting its slots, so that together they never exceed its limits.
SELECT name, concurrency, per_key, worker_concurrency, rate_limit, rate_period, priority
FROM queues WHERE name = %s FOR UPDATE;

-- name: queue_held
-- The queue's slots: its objects under a live lease (by the database clock), per key,
-- and how many of them the claiming worker holds (objects_queue_held).
SELECT o.queue_key, count(*), count(*) FILTER (WHERE o.lease_owner = %(owner)s)
FROM objects o
WHERE o.queue = %(queue)s AND o.lease_owner IS NOT NULL
  AND o.lease_expires > extract(epoch FROM clock_timestamp())::double precision
GROUP BY o.queue_key;

-- name: queue_started
-- Objects of the queue first claimed within the limiter's period (objects_queue_starts).
SELECT count(*) FROM objects
WHERE queue = %(queue)s
  AND started_at > extract(epoch FROM clock_timestamp())::double precision - %(period)s;

-- name: queue_candidates
-- Runnable objects of the queue, in its order (objects asked to cancel first, then by
-- priority, then by ready time): those this node can serve, of keys not at their cap
-- (%(full)s), and, when the limiter is at its limit (%(fresh)s false), only ones that
-- already started. With no room (%(room)s false) only objects asked to cancel.
WITH db AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now)
SELECT o.object_id, o.queue_key, o.started_at IS NULL, o.cancel_requested
FROM objects o, db
WHERE o.queue = %(queue)s AND o.ready_at <= %(now)s
  AND (o.paused = FALSE OR o.cancel_requested)
  AND (o.lease_expires IS NULL OR o.lease_expires <= db.now)
  AND (o.cancel_requested OR (
        %(room)s
    AND (%(fresh)s OR o.started_at IS NOT NULL)
    AND (o.queue_key IS NULL OR NOT (o.queue_key = ANY(%(full)s::text[])))
    AND (%(serves)s::text[] IS NULL
         OR (o.agent || '@' || o.agent_version) = ANY(%(serves)s::text[]))
    AND o.requires <@ %(caps)s::text[]
    AND NOT (%(node)s::text = ANY(o.avoid))))
ORDER BY o.cancel_requested DESC, o.priority, o.ready_at, o.object_id
LIMIT %(scan)s;

-- name: claim_queued
-- The objects admitted (perdure.core.flow.admit) leased, as claim leases; started_at
-- keeps the first claim's time.
WITH db AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now)
UPDATE objects o
SET epoch = o.epoch + 1, lease_owner = %(owner)s, lease_expires = db.now + %(lease)s,
    status = 'running', phase = 'evaluation', updated_at = %(now)s,
    crashes = CASE WHEN o.lease_owner IS NULL THEN 0
                   WHEN o.crash_seq = o.head_seq THEN o.crashes + 1 ELSE 1 END,
    crash_seq = o.head_seq,
    started_at = COALESCE(o.started_at, db.now)
FROM db
WHERE o.object_id = ANY(%(ids)s::text[]) AND o.ready_at <= %(now)s
  AND (o.lease_expires IS NULL OR o.lease_expires <= db.now)
RETURNING o.object_id, o.epoch, o.lease_expires, o.cancel_requested, o.paused, o.crashes;

-- name: queue_stats
-- Each queue's limits, its slots held, its objects runnable and not held, its dormant
-- ones (neither held nor runnable, not terminal), and its starts within the period.
WITH db AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now),
counts AS (
    SELECT o.queue,
           count(*) FILTER (WHERE o.lease_owner IS NOT NULL AND o.lease_expires > db.now)
               AS held,
           count(*) FILTER (WHERE NOT (o.lease_owner IS NOT NULL AND o.lease_expires > db.now)
                              AND o.ready_at <= %(now)s
                              AND (o.paused = FALSE OR o.cancel_requested)) AS ready,
           count(*) AS live
    FROM objects o, db
    WHERE o.queue IS NOT NULL AND o.status NOT IN ('completed', 'failed', 'cancelled')
    GROUP BY o.queue
)
SELECT q.name, q.concurrency, q.per_key, q.worker_concurrency, q.rate_limit, q.rate_period,
       q.priority, COALESCE(c.held, 0), COALESCE(c.ready, 0),
       COALESCE(c.live - c.held - c.ready, 0),
       CASE WHEN q.rate_period IS NULL THEN 0 ELSE (
           SELECT count(*) FROM objects s, db
           WHERE s.queue = q.name AND s.started_at > db.now - q.rate_period) END
FROM queues q LEFT JOIN counts c ON c.queue = q.name
ORDER BY q.name;

-- name: renew
UPDATE objects
SET lease_expires = extract(epoch FROM clock_timestamp())::double precision + %(lease)s
WHERE object_id = %(object_id)s AND epoch = %(epoch)s AND lease_owner IS NOT NULL
RETURNING object_id, epoch, lease_expires, cancel_requested, paused, crashes;

-- name: append
-- Fenced appends to distinct objects in one statement (a group commit is one of these,
-- or a few when one object appends twice): %(ops)s holds one JSON object per append,
-- %(records)s one per record (bytea as base64), both tagged with the append's index i.
-- An append whose epoch or head no longer matches updates nothing and inserts none of
-- its records; the statement returns the index of every append that went through, and
-- wakes idle nodes when one lets go of an object that is runnable now (NOTIFY is sent
-- at commit, dropped on rollback). %(seals)s holds the commit seals the records refer
-- to (inserted whether or not their appends went through: a seal only vouches for hashes).
WITH seal AS (
    INSERT INTO seals (digest, node_id, hashes, signature)
    SELECT decode(s.digest, 'base64'), s.node_id, decode(s.hashes, 'base64'),
           decode(s.signature, 'base64')
    FROM jsonb_to_recordset(%(seals)s::jsonb) AS s(
        digest text, node_id text, hashes text, signature text)
    ON CONFLICT (digest) DO NOTHING
), upd AS (
    UPDATE objects o
    SET head_seq = COALESCE(p.head_seq, o.head_seq),
        head_hash = COALESCE(decode(p.head_hash, 'base64'), o.head_hash),
        status = p.status,
        phase = p.phase,
        ready_at = CASE
            -- A cancel asked for while the node ran must not be lost when it lets go.
            WHEN o.cancel_requested AND p.status NOT IN ('completed', 'failed', 'cancelled')
            THEN %(now)s
            WHEN p.waiting_event IS NOT NULL AND EXISTS (
                SELECT 1 FROM inbox
                WHERE inbox.object_id = p.object_id
                  -- an update request wakes a wait for an event of the agent's own
                  -- (run.wait_for takes updates); perdure's own waits take none
                  AND (inbox.name = p.waiting_event
                       OR (inbox.name = 'perdure:update'
                           AND p.waiting_event NOT LIKE 'perdure:%%'))
                  AND inbox.consumed_seq IS NULL
                  -- not one this append consumes: it is taken, not pending
                  AND inbox.event_id <> ALL(COALESCE(p.consumed, '{}'::bigint[])))
            THEN %(now)s
            ELSE p.ready_at END,
        waiting_event = p.waiting_event,
        result = COALESCE(decode(p.result, 'base64'), o.result),
        lease_owner = CASE WHEN p.release THEN NULL ELSE o.lease_owner END,
        lease_expires = CASE WHEN p.release THEN NULL ELSE o.lease_expires END,
        parked = p.parked,
        note = p.note,
        requires = COALESCE(p.requires, o.requires),
        avoid = CASE WHEN p.clear_avoid THEN '{}'::text[]
                     WHEN p.avoid_node IS NOT NULL THEN array_append(o.avoid, p.avoid_node)
                     ELSE o.avoid END,
        updated_at = %(now)s
    FROM jsonb_to_recordset(%(ops)s::jsonb) AS p(
        i int, object_id text, epoch bigint, expected_head bigint, head_seq bigint,
        head_hash text, status text, phase text, waiting_event text,
        ready_at double precision, result text, release boolean, parked boolean,
        note text, requires text[], avoid_node text, clear_avoid boolean,
        unless_cancelled boolean,
        consumed bigint[])
    WHERE o.object_id = p.object_id AND o.epoch = p.epoch
      AND (p.expected_head IS NULL OR o.head_seq = p.expected_head)
      -- Nothing is appended to memory that holds its terminal record.
      AND (p.head_seq IS NULL OR o.status NOT IN ('completed', 'failed', 'cancelled'))
      -- A completion is refused while a cancel is pending: the node writes the cancel.
      AND NOT (COALESCE(p.unless_cancelled, FALSE) AND o.cancel_requested)
    RETURNING p.i, o.object_id, o.ready_at, p.release, o.cancel_requested
), ins AS (
    INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body,
                         prev_hash, hash, signature)
    SELECT r.object_id, r.seq, r.trace_id, r.ts_us, r.node_id, r.policy_ref, r.kind,
           decode(r.body, 'base64'), decode(r.prev_hash, 'base64'), decode(r.hash, 'base64'),
           decode(r.signature, 'base64')
    FROM jsonb_to_recordset(%(records)s::jsonb) AS r(
        i int, object_id text, seq bigint, trace_id text, ts_us bigint, node_id text,
        policy_ref text, kind text, body text, prev_hash text, hash text, signature text)
    JOIN upd ON upd.i = r.i
)
SELECT i, CASE WHEN release AND ready_at <= %(now)s
               THEN pg_notify('perdure_wake', object_id) END, cancel_requested
FROM upd;

-- name: cancel_state
SELECT epoch, cancel_requested FROM objects WHERE object_id = %s;

-- name: append_ending
-- ``append`` for a batch in which an object ends and asks its live children to cancel
-- (the same statement with one more step, ``kids``; the plain one never pays for it).
-- One statement cannot update a row twice, so a child that appends in the same batch is
-- left out of ``kids`` and takes its cancel in ``upd`` (when its parent's append passes
-- the fence); %(ending)s names the objects of the batch that end and cancel children.
-- Fenced appends to distinct objects in one statement (a group commit is one of these,
-- or a few when one object appends twice): %(ops)s holds one JSON object per append,
-- %(records)s one per record (bytea as base64), both tagged with the append's index i.
-- An append whose epoch or head no longer matches updates nothing and inserts none of
-- its records; the statement returns the index of every append that went through, and
-- wakes idle nodes when one lets go of an object that is runnable now (NOTIFY is sent
-- at commit, dropped on rollback). %(seals)s holds the commit seals the records refer
-- to (inserted whether or not their appends went through: a seal only vouches for hashes).
WITH seal AS (
    INSERT INTO seals (digest, node_id, hashes, signature)
    SELECT decode(s.digest, 'base64'), s.node_id, decode(s.hashes, 'base64'),
           decode(s.signature, 'base64')
    FROM jsonb_to_recordset(%(seals)s::jsonb) AS s(
        digest text, node_id text, hashes text, signature text)
    ON CONFLICT (digest) DO NOTHING
), upd AS (
    UPDATE objects o
    SET head_seq = COALESCE(p.head_seq, o.head_seq),
        head_hash = COALESCE(decode(p.head_hash, 'base64'), o.head_hash),
        status = p.status,
        phase = p.phase,
        ready_at = CASE
            -- A cancel asked for while the node ran must not be lost when it lets go.
            WHEN o.cancel_requested AND p.status NOT IN ('completed', 'failed', 'cancelled')
            THEN %(now)s
            -- The same for a child whose parent ends in this statement (below).
            WHEN o.parent_id = ANY(%(ending)s::text[])
                 AND p.status NOT IN ('completed', 'failed', 'cancelled')
                 AND EXISTS (SELECT 1 FROM objects po, jsonb_to_recordset(%(ops)s::jsonb)
                                 AS e(object_id text, epoch bigint, expected_head bigint,
                                      cancel_children boolean)
                             WHERE po.object_id = o.parent_id AND e.object_id = po.object_id
                               AND e.cancel_children AND po.epoch = e.epoch
                               AND (e.expected_head IS NULL
                                    OR po.head_seq = e.expected_head)
                               AND po.status NOT IN ('completed', 'failed', 'cancelled'))
            THEN %(now)s
            WHEN p.waiting_event IS NOT NULL AND EXISTS (
                SELECT 1 FROM inbox
                WHERE inbox.object_id = p.object_id
                  -- an update request wakes a wait for an event of the agent's own
                  -- (run.wait_for takes updates); perdure's own waits take none
                  AND (inbox.name = p.waiting_event
                       OR (inbox.name = 'perdure:update'
                           AND p.waiting_event NOT LIKE 'perdure:%%'))
                  AND inbox.consumed_seq IS NULL
                  -- not one this append consumes: it is taken, not pending
                  AND inbox.event_id <> ALL(COALESCE(p.consumed, '{}'::bigint[])))
            THEN %(now)s
            ELSE p.ready_at END,
        waiting_event = p.waiting_event,
        result = COALESCE(decode(p.result, 'base64'), o.result),
        lease_owner = CASE WHEN p.release THEN NULL ELSE o.lease_owner END,
        lease_expires = CASE WHEN p.release THEN NULL ELSE o.lease_expires END,
        parked = p.parked,
        note = p.note,
        requires = COALESCE(p.requires, o.requires),
        avoid = CASE WHEN p.clear_avoid THEN '{}'::text[]
                     WHEN p.avoid_node IS NOT NULL THEN array_append(o.avoid, p.avoid_node)
                     ELSE o.avoid END,
        -- A child that appends in this statement, whose parent ends in it: ``kids``
        -- cannot reach its row (one statement updates a row once), so the cancel is set here.
        cancel_requested = o.cancel_requested OR (o.parent_id = ANY(%(ending)s::text[])
                 AND p.status NOT IN ('completed', 'failed', 'cancelled')
                 AND EXISTS (SELECT 1 FROM objects po, jsonb_to_recordset(%(ops)s::jsonb)
                                 AS e(object_id text, epoch bigint, expected_head bigint,
                                      cancel_children boolean)
                             WHERE po.object_id = o.parent_id AND e.object_id = po.object_id
                               AND e.cancel_children AND po.epoch = e.epoch
                               AND (e.expected_head IS NULL
                                    OR po.head_seq = e.expected_head)
                               AND po.status NOT IN ('completed', 'failed', 'cancelled'))),
        updated_at = %(now)s
    FROM jsonb_to_recordset(%(ops)s::jsonb) AS p(
        i int, object_id text, epoch bigint, expected_head bigint, head_seq bigint,
        head_hash text, status text, phase text, waiting_event text,
        ready_at double precision, result text, release boolean, parked boolean,
        note text, requires text[], avoid_node text, clear_avoid boolean,
        unless_cancelled boolean, cancel_children boolean,
        consumed bigint[])
    WHERE o.object_id = p.object_id AND o.epoch = p.epoch
      AND (p.expected_head IS NULL OR o.head_seq = p.expected_head)
      -- Nothing is appended to memory that holds its terminal record.
      AND (p.head_seq IS NULL OR o.status NOT IN ('completed', 'failed', 'cancelled'))
      -- A completion is refused while a cancel is pending: the node writes the cancel.
      AND NOT (COALESCE(p.unless_cancelled, FALSE) AND o.cancel_requested)
    RETURNING p.i, o.object_id, o.ready_at, p.release, o.cancel_requested,
              p.cancel_children
), kids AS (
    UPDATE objects c
    SET cancel_requested = TRUE, ready_at = LEAST(COALESCE(c.ready_at, %(now)s), %(now)s),
        updated_at = %(now)s
    FROM upd
    WHERE upd.cancel_children AND c.parent_id = upd.object_id
      AND c.status NOT IN ('completed', 'failed', 'cancelled')
      AND NOT EXISTS (SELECT 1 FROM upd u WHERE u.object_id = c.object_id)
    RETURNING pg_notify('perdure_wake', c.object_id)
), ins AS (
    INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body,
                         prev_hash, hash, signature)
    SELECT r.object_id, r.seq, r.trace_id, r.ts_us, r.node_id, r.policy_ref, r.kind,
           decode(r.body, 'base64'), decode(r.prev_hash, 'base64'), decode(r.hash, 'base64'),
           decode(r.signature, 'base64')
    FROM jsonb_to_recordset(%(records)s::jsonb) AS r(
        i int, object_id text, seq bigint, trace_id text, ts_us bigint, node_id text,
        policy_ref text, kind text, body text, prev_hash text, hash text, signature text)
    JOIN upd ON upd.i = r.i
)
SELECT i, CASE WHEN release AND ready_at <= %(now)s
               THEN pg_notify('perdure_wake', object_id) END, cancel_requested
FROM upd;

-- name: rewake
-- After appends that let go of objects waiting for an event: wakes those whose awaited
-- event is in the inbox now. An event sent while the release waited for the row's lock
-- (App.send holds it) is invisible to the release's own statement, whose snapshot was
-- taken before the send committed; this later statement sees it (READ COMMITTED: a new
-- statement, a new snapshot), and the send's own wake-up skipped the row while it was
-- leased. Idempotent: it only wakes what an event waits for.
UPDATE objects o SET ready_at = %(now)s
WHERE o.object_id = ANY(%(ids)s) AND o.lease_owner IS NULL
  AND o.waiting_event IS NOT NULL AND (o.ready_at IS NULL OR o.ready_at > %(now)s)
  AND EXISTS (SELECT 1 FROM inbox i WHERE i.object_id = o.object_id
              AND i.name = o.waiting_event AND i.consumed_seq IS NULL)
RETURNING pg_notify('perdure_wake', o.object_id);

-- name: consume_event
UPDATE inbox SET consumed_seq = %s
WHERE event_id = %s AND object_id = %s AND consumed_seq IS NULL;

-- name: object_status
SELECT status FROM objects WHERE object_id = %s FOR UPDATE;

-- name: debounce_row
SELECT status, dedupe_key, started_at FROM objects WHERE object_id = %s FOR UPDATE;

-- name: debounce_release
-- A debounced object that started gives its key up (objects_dedupe): the next start
-- with it makes a new object.
UPDATE objects SET dedupe_key = NULL WHERE object_id = %s AND dedupe_key = %s;

-- name: debounce_push
-- A debounced object not claimed yet waits for the quiet period again (not one asked
-- to cancel: its end is due now).
UPDATE objects SET ready_at = %(ready_at)s, updated_at = %(now)s
WHERE object_id = %(object_id)s AND NOT cancel_requested;

-- name: insert_event
INSERT INTO inbox (object_id, name, payload, dedupe_key, sent_at, seal)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (object_id, dedupe_key) DO NOTHING;

-- name: wake_for_event
-- Wakes an object waiting for this event; a control event (``perdure:`` prefix) wakes any.
UPDATE objects SET ready_at = %(now)s
WHERE object_id = %(object_id)s AND lease_owner IS NULL
  AND (waiting_event = %(name)s OR left(%(name)s, 8) = 'perdure:')
  AND (ready_at IS NULL OR ready_at > %(now)s)
  AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: notify
SELECT pg_notify('perdure_wake', %s);

-- name: pending_events
SELECT event_id, object_id, name, payload, dedupe_key, sent_at, seal FROM inbox
WHERE object_id = %s AND consumed_seq IS NULL ORDER BY event_id;

-- name: set_paused
UPDATE objects SET paused = %(paused)s, updated_at = %(now)s,
                   status = CASE WHEN NOT %(paused)s AND status = 'paused' THEN 'ready'
                                 ELSE status END
WHERE object_id = %(object_id)s;

-- name: request_cancel
UPDATE objects SET cancel_requested = TRUE,
                   ready_at = LEAST(COALESCE(ready_at, %(now)s), %(now)s),
                   updated_at = %(now)s
WHERE object_id = %(object_id)s;

-- name: unpark
UPDATE objects SET parked = FALSE, note = NULL, ready_at = %(now)s, status = 'ready',
                   updated_at = %(now)s, crashes = 0
WHERE object_id = %(object_id)s AND parked;

-- name: next_ready_at
-- When the next object becomes claimable: its ready time, or its lease expiry if later.
-- The objects_due index holds exactly this expression under exactly this WHERE (keep
-- them the same): the answer is its first entry, however many objects sleep.
SELECT MIN(GREATEST(ready_at, COALESCE(lease_expires, ready_at)))
FROM objects WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);

-- name: leases_held
SELECT object_id, lease_owner, epoch FROM objects
WHERE lease_owner LIKE %(prefix)s
  AND lease_expires > extract(epoch FROM clock_timestamp())::double precision;

-- name: expire_lease
UPDATE objects
SET lease_expires = extract(epoch FROM clock_timestamp())::double precision,
    updated_at = %(now)s
WHERE object_id = %(object_id)s AND epoch = %(epoch)s AND lease_owner = %(owner)s;

-- name: control_flags
SELECT object_id, epoch, cancel_requested, paused FROM objects WHERE object_id = ANY(%s);

-- name: heartbeat
-- A node counts as live until live_until (its lease length ahead) unless it beats again.
INSERT INTO nodes (node_id, public_key, created_at, serves, capabilities, seen_at, live_until)
VALUES (%(node_id)s, %(public_key)s, %(now)s, %(serves)s, %(caps)s, %(now)s, %(live_until)s)
ON CONFLICT (node_id) DO UPDATE SET public_key = excluded.public_key,
    serves = excluded.serves, capabilities = excluded.capabilities,
    seen_at = excluded.seen_at, live_until = excluded.live_until;

-- name: node_gone
-- A node that stopped cleanly is gone at once, not when its last heartbeat runs out.
UPDATE nodes SET live_until = %(now)s WHERE node_id = %(node_id)s AND live_until > %(now)s;

-- name: live_nodes
SELECT node_id, serves, capabilities, seen_at, live_until FROM nodes
WHERE live_until IS NOT NULL AND live_until > %(now)s ORDER BY node_id;

-- name: data_key
SELECT object_id, key_id, wrapped, seal_all FROM data_keys WHERE object_id = %s;

-- name: put_data_key
-- The first data key of an object stays: a second writer (another node starting or
-- sealing for the same object at the same moment) reads the first one back.
INSERT INTO data_keys (object_id, key_id, wrapped, seal_all, updated_at)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (object_id) DO NOTHING;

-- name: data_keys_not_under
SELECT object_id, key_id, wrapped, seal_all FROM data_keys
WHERE key_id <> %s AND object_id > %s ORDER BY object_id LIMIT %s;

-- name: rewrap_data_key
-- Compare-and-set: only a row still wrapped under the key it was read under.
UPDATE data_keys SET key_id = %s, wrapped = %s, updated_at = %s
WHERE object_id = %s AND key_id = %s AND wrapped = %s;

-- name: data_key_counts
SELECT key_id, count(*) FROM data_keys GROUP BY key_id ORDER BY key_id;

-- name: put_checkpoint
-- Fenced like an append: only while the object's row still has the writer's epoch and a
-- lease owner. One row per (object, slot): the latest value replaces the one before.
INSERT INTO checkpoints (object_id, slot, epoch, after_seq, after_hash, body, signer,
                         signature, written_at)
SELECT %(object_id)s, %(slot)s, %(epoch)s, %(after_seq)s, %(after_hash)s, %(body)s,
       %(signer)s, %(signature)s, %(written_at)s
WHERE EXISTS (SELECT 1 FROM objects WHERE object_id = %(object_id)s
                                      AND epoch = %(epoch)s AND lease_owner IS NOT NULL)
ON CONFLICT (object_id, slot) DO UPDATE SET
    epoch = excluded.epoch, after_seq = excluded.after_seq,
    after_hash = excluded.after_hash, body = excluded.body, signer = excluded.signer,
    signature = excluded.signature, written_at = excluded.written_at;

-- name: checkpoints
SELECT object_id, slot, epoch, after_seq, after_hash, body, signer, signature, written_at
FROM checkpoints WHERE object_id = %s ORDER BY slot;

-- name: checkpoint_fence
-- Held until the transaction ends, so that no claim moves the epoch in between.
SELECT 1 FROM objects WHERE object_id = %s AND epoch = %s AND lease_owner IS NOT NULL
FOR UPDATE;

-- name: delete_checkpoint
DELETE FROM checkpoints WHERE object_id = %s AND slot = %s;

-- name: delete_checkpoints
DELETE FROM checkpoints WHERE object_id = %s;

-- name: browse_objects
-- The dashboard's objects, newest first by (created_at, object_id), one page after the
-- key (c_at, c_id) (NULL: the first page). The key is also a range on created_at, so
-- the objects_created index serves page 1,000 as it serves page 1 (never an offset).
-- A filter given as NULL matches every row (each execution is planned with its values,
-- so PostgreSQL drops those terms and picks the index a given filter can use). status
-- is a stored status or one derived from the flags: parked; paused (and not parked);
-- running (a lease live at now); a stored status that is not terminal matches rows
-- neither parked nor paused. node holds the lease now (owners are "node/worker"); q is
-- the start of the id, compared exactly (no LIKE: an id may hold % or _); lk = lv is a
-- label the object was started with (its first record's context).
SELECT * FROM objects
WHERE created_at <= COALESCE(%(until)s::float8, 1e300::float8)
  AND created_at >= COALESCE(%(since)s::float8, -1e300::float8)
  AND created_at <= COALESCE(%(c_at)s::float8, 1e300::float8)
  AND (%(c_at)s::float8 IS NULL OR created_at < %(c_at)s::float8
       OR object_id > %(c_id)s::text)
  AND (%(status)s::text IS NULL
       OR (%(status)s::text = 'parked' AND parked)
       OR (%(status)s::text = 'paused' AND paused AND NOT parked)
       OR (%(status)s::text = 'running' AND lease_owner IS NOT NULL
           AND lease_expires > %(now)s::float8)
       OR (%(status)s::text NOT IN ('parked', 'paused', 'running')
           AND status = %(status)s::text
           AND (status IN ('completed', 'failed', 'cancelled')
                OR (NOT parked AND NOT paused))))
  AND (%(phase)s::text IS NULL OR phase = %(phase)s::text)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(version)s::text IS NULL OR agent_version = %(version)s::text)
  AND (%(parent)s::text IS NULL OR parent_id = %(parent)s::text)
  AND (%(node)s::text IS NULL OR (starts_with(lease_owner, %(node)s::text || '/')
                                  AND lease_expires > %(now)s::float8))
  AND (%(q)s::text IS NULL OR starts_with(object_id, %(q)s::text))
  AND (%(lk)s::text IS NULL OR EXISTS (
        SELECT 1 FROM records r
        WHERE r.object_id = objects.object_id AND r.seq = 1 AND r.kind = 'instantiated'
          AND convert_from(r.body, 'UTF8')::jsonb -> 'context' -> 'labels'
              ->> %(lk)s::text = %(lv)s::text))
ORDER BY created_at DESC, object_id
LIMIT %(limit)s;

-- name: records_of_kinds
-- An object's records of some kinds, oldest first: its intent and refinements, when its
-- memory is too long to read whole for a page.
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records
WHERE object_id = %(object_id)s AND kind = ANY(%(kinds)s::text[])
ORDER BY seq
LIMIT %(limit)s;

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
  AND waiting_event NOT LIKE 'perdure:%%' AND status = 'dormant'
ORDER BY updated_at DESC, object_id
LIMIT %(limit)s;

-- name: lease_holders
SELECT object_id, lease_owner FROM objects
WHERE lease_owner IS NOT NULL AND lease_expires > %(now)s
ORDER BY object_id
LIMIT %(limit)s;

-- name: queue_key_holders
-- The keys of a queue holding slots now, most first (objects_queue_held).
SELECT queue_key, count(*) AS held FROM objects
WHERE queue = %(queue)s AND lease_owner IS NOT NULL AND lease_expires > %(now)s
GROUP BY queue_key
ORDER BY held DESC, queue_key IS NOT NULL, queue_key
LIMIT %(limit)s;

-- name: ended_since
SELECT status, updated_at FROM objects
WHERE updated_at >= %(since)s AND status IN ('completed', 'failed', 'cancelled');

-- name: updated_since
SELECT object_id FROM objects
WHERE updated_at >= %(since)s
ORDER BY updated_at DESC, object_id
LIMIT %(limit)s;

-- name: bodies_since
-- Records of some objects and kinds written since since_us: the last hour's spend and
-- wake latency.
SELECT object_id, seq, kind, ts_us, body FROM records
WHERE object_id = ANY(%(ids)s::text[]) AND ts_us >= %(since_us)s
  AND kind = ANY(%(kinds)s::text[])
ORDER BY object_id, seq;

-- name: sent_at
SELECT event_id, sent_at FROM inbox WHERE event_id = ANY(%(ids)s::bigint[]);

-- name: declare_model_quota
-- A quota's limits (what 429s taught is kept).
INSERT INTO model_quotas (provider, model, tokens_per_minute, requests_per_minute,
                          window_seconds, updated_at)
VALUES (%(provider)s, %(model)s, %(tokens_per_minute)s, %(requests_per_minute)s,
        %(window)s, %(now)s)
ON CONFLICT (provider, model) DO UPDATE SET
    tokens_per_minute = excluded.tokens_per_minute,
    requests_per_minute = excluded.requests_per_minute,
    window_seconds = excluded.window_seconds, updated_at = excluded.updated_at;

-- name: model_quota_lock
-- The quota's row, held until the transaction ends: reservations of one quota take
-- turns, whichever node makes them.
SELECT provider, model, tokens_per_minute, requests_per_minute, window_seconds, factor,
       adapted_at, blocked_until, throttles, throttled_at
FROM model_quotas WHERE provider = %(provider)s AND model = %(model)s FOR UPDATE;

-- name: model_quotas
SELECT provider, model, tokens_per_minute, requests_per_minute, window_seconds, factor,
       adapted_at, blocked_until, throttles, throttled_at
FROM model_quotas ORDER BY provider, model;

-- name: quota_prune
-- Reservations that left the quota's window.
DELETE FROM quota_reservations
WHERE provider = %(provider)s AND model = %(model)s AND at <= %(since)s
  AND (settled OR NOT EXISTS (SELECT 1 FROM objects o
                              WHERE o.object_id = quota_reservations.object_id
                                AND o.lease_owner IS NOT NULL
      AND o.lease_expires > extract(epoch FROM clock_timestamp())::double precision));

-- name: quota_window
-- A call in flight counts while its object's lease is live (by the database clock),
-- however long it takes.
SELECT r.at, r.tokens, r.settled FROM quota_reservations r
LEFT JOIN objects o ON o.object_id = r.object_id
WHERE r.provider = %(provider)s AND r.model = %(model)s
  AND (r.at > %(since)s OR (NOT r.settled AND o.lease_owner IS NOT NULL
      AND o.lease_expires > extract(epoch FROM clock_timestamp())::double precision));

-- name: quota_reserve
INSERT INTO quota_reservations (provider, model, object_id, holder, tokens, at)
VALUES (%(provider)s, %(model)s, %(object_id)s, %(holder)s, %(tokens)s, %(now)s)
RETURNING ticket;

-- name: quota_settle
-- What the provider reported, counted from when the reply came.
UPDATE quota_reservations SET tokens = %(tokens)s, at = GREATEST(at, %(now)s), settled = TRUE
WHERE ticket = %(ticket)s;

-- name: quota_adapt
UPDATE model_quotas SET factor = %(factor)s, adapted_at = %(adapted_at)s,
    blocked_until = %(blocked_until)s, throttles = %(throttles)s,
    throttled_at = %(throttled_at)s
WHERE provider = %(provider)s AND model = %(model)s;

-- name: alert_fire
-- Fire unless firing already: the row comes back only to the write that fired it.
INSERT INTO alerts (rule, subject, state, summary, node_id, fired_at, changed_at)
VALUES (%(rule)s, %(subject)s, 'firing', %(summary)s, %(node_id)s, %(now)s, %(now)s)
ON CONFLICT (rule, subject) DO UPDATE
SET state = 'firing', summary = excluded.summary, node_id = excluded.node_id,
    fired_at = excluded.fired_at, resolved_at = NULL, changed_at = excluded.changed_at
WHERE alerts.state <> 'firing'
RETURNING rule;

-- name: alert_resolve
-- Resolve if firing: the row comes back only to the write that resolved it.
UPDATE alerts SET state = 'resolved', resolved_at = %(now)s, changed_at = %(now)s
WHERE rule = %(rule)s AND subject = %(subject)s AND state = 'firing'
RETURNING rule, subject, state, summary, node_id, fired_at, resolved_at;

-- name: alerts
SELECT rule, subject, state, summary, node_id, fired_at, resolved_at FROM alerts
WHERE (CAST(%(state)s AS TEXT) IS NULL OR state = %(state)s)
  AND substr(rule, 1, length(%(prefix)s)) = %(prefix)s
ORDER BY changed_at DESC, rule, subject
LIMIT %(limit)s;
