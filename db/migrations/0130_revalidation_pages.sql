-- Issue 34 item 1: `revalidate plan --all-finalized` and `revalidate owner` read an
-- owner's finalized links a page at a time in link-key order (COLLATE "C": the order a
-- manifest's members are sorted in, whatever the cluster's locale), each page after the
-- last key of the one before. Without this index every page was a scan and sort of the
-- whole link table (1.1 s a page at 100,000 links, quadratic in the owner's size). Its
-- columns and predicate are ones other indexes already cover (owner key, link key,
-- status), so the revalidation's and the PATCH path's UPDATEs of a link stay HOT
-- (migration 0070).
CREATE INDEX connector_remote_link_finalized_key_ix
    ON connector_remote_link (connector_owner_key, link_key COLLATE "C")
    WHERE status = 'finalized';
