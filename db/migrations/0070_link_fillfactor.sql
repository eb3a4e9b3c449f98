-- Issue 16 (P4): leave half of each link page free, so an UPDATE of a link can put the
-- row's new version on its own page (a HOT update) instead of adding an entry to each of
-- the table's seven indexes. Every PATCH, drift finding, mirror write and operator stamp
-- updates its link, and a bulk revalidation updates every link of a manifest in one
-- transaction: measured over 100,000 links, apply's UPDATE took 10.3 s with full pages
-- and 4.8 s at fillfactor 50 (70 gave 9.7 s: a link row is about 1 KB, so only two of
-- a page's five rows then find room). The price is about twice the table's heap size.
-- Applies to pages written from now on; `VACUUM FULL connector_remote_link` (or
-- pg_repack) rewrites existing ones.
ALTER TABLE connector_remote_link SET (fillfactor = 50);
