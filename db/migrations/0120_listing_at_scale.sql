-- Issue 34 item 4: listing, finding and `status` at a million links, with no full scan.
-- Lists page by keyset (`--after`): newest first on (created_at, key), with or without a
-- status filter. `status` counts links by state from the narrow (status) index alone: an
-- index-only scan of a deduplicated index (a few MB at a million links, where the link
-- heap at fillfactor 50 is above 1 GB and a (status, created_at, link_key) index was
-- 200 MB and took a second to count). A links page of one status walks the
-- (created_at, link_key) index for a common status and the (status) one for a rare one.
-- created_at and status are rarely written after the insert, so the revalidation's and
-- the PATCH path's UPDATEs of a link stay HOT (migration 0070).
CREATE INDEX connector_remote_link_created_ix
    ON connector_remote_link (created_at, link_key);
CREATE INDEX connector_remote_link_status_ix ON connector_remote_link (status);
CREATE INDEX connector_push_attempt_created_ix
    ON connector_push_attempt (created_at, attempt_id);
CREATE INDEX connector_push_attempt_status_ix
    ON connector_push_attempt (status, created_at, attempt_id);
-- `status`: creates finalized in the last minutes (the finalized set is every create).
CREATE INDEX connector_push_attempt_finalized_ix
    ON connector_push_attempt (updated_at) WHERE status = 'finalized';
-- `status`: queued, recently succeeded and unknown-outcome PATCHes.
CREATE INDEX connector_patch_dispatch_status_ix
    ON connector_patch_dispatch (status, updated_at);
