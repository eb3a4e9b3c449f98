-- The WAL a create writes (bench P9): an attempt row is written four times per create
-- (reserved, claimed, sent, finalized) and no update of it can be HOT, because `status`
-- is in the key or the predicate of several of its indexes (the ID-5 one among them).
-- So every write adds an entry to each index whose predicate it meets; an index no
-- query reads costs four entries per create for nothing.
--
-- Dropped, with the plans of the queries on a table of 100,000 attempts and links
-- (tests/db/scale_rows.py) before and after:
--   * connector_push_attempt_record_ix (owner, source_object, source_record_id) and
--     connector_remote_link_record_ix, the same: every query naming a record (lineage,
--     the slot statuses of a record, forget, search by record id) is planned on the
--     `source_record_ix` of its table, whose single key is as selective.
--   * connector_push_attempt_claim_ix (dispatch_lane, status, claim_expires_at): no
--     statement reads or writes claim_expires_at; the relay's sweep, the deferred
--     association waiters, PARKED_BY_REASON and QUEUE_DEPTH read
--     connector_push_attempt_status_ix (status, created_at, attempt_id) instead.
DROP INDEX connector_push_attempt_record_ix;
DROP INDEX connector_remote_link_record_ix;
DROP INDEX connector_push_attempt_claim_ix;

-- Room on each page for the row's next version: an update that finds it on the same
-- page logs only the bytes between the first and the last changed column, not the whole
-- row, and a page's dead versions are pruned in place. New pages only; the rows written
-- before keep their pages.
ALTER TABLE connector_push_attempt SET (fillfactor = 70);
