-- Issue 34 item 4: `status` (and every worker's gauges, read every 15 s) count links by
-- state without reading the links. Migration 0120 counted them from the (status) index
-- alone, an index-only scan of every link: fast only once VACUUM has marked the heap
-- all-visible. Right after a bulk load of a million links (a backfill, an initial sync)
-- each index entry costs a heap visit, and `status` took 2.7 s (bench-scale); at ten
-- million links it would take ten times that even when settled.
--
-- Here each change of a link's state appends its deltas in the same transaction, so the
-- sums are exactly the counts in any snapshot. Appends never wait on each other (a
-- single counter row per state would serialize every create's writeback on it).
-- `connector_fold_link_state_counts()` folds the rows into one per state; the worker's
-- gauge loop calls it, so the table stays a few rows per state between folds.
CREATE TABLE connector_link_state_count (
    status text NOT NULL,
    n bigint NOT NULL
);

-- No link is written from here to the commit: those present are counted at the end, every
-- later change by the triggers.
LOCK TABLE connector_remote_link IN SHARE MODE;

-- A set-wise INSERT (COPY included): one row per state it added.
CREATE OR REPLACE FUNCTION connector_link_state_count_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO connector_link_state_count (status, n)
    SELECT status, count(*) FROM added GROUP BY status;
    RETURN NULL;
END $$;

-- Row by row, and only when the state changes: a bulk UPDATE that leaves the state alone
-- (revalidation's fingerprints, a PATCH's bookkeeping) costs one comparison per row.
CREATE OR REPLACE FUNCTION connector_link_state_count_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO connector_link_state_count (status, n)
    VALUES (OLD.status, -1), (NEW.status, 1);
    RETURN NULL;
END $$;

-- Links are never deleted or truncated (migration 0001 refuses both), so an INSERT and a
-- change of state are the only writes that move a count.
CREATE TRIGGER connector_link_state_count_insert_tg AFTER INSERT ON connector_remote_link
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION connector_link_state_count_inserted();
CREATE TRIGGER connector_link_state_count_update_tg AFTER UPDATE OF status
    ON connector_remote_link
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION connector_link_state_count_moved();

-- One row per state with a non-zero count. Two folds at once are safe: a row the other
-- fold deleted is skipped, and neither sees the other's sum row before it commits.
CREATE OR REPLACE FUNCTION connector_fold_link_state_counts() RETURNS void
LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM connector_link_state_count RETURNING status, n)
    INSERT INTO connector_link_state_count (status, n)
    SELECT status, sum(n) FROM gone GROUP BY status HAVING sum(n) <> 0;
$$;

-- The links present now, counted under the lock taken above.
INSERT INTO connector_link_state_count (status, n)
SELECT status, count(*) FROM connector_remote_link GROUP BY status;
