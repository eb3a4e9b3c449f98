"""`make bench`: the create path's throughput against a Temporal floor (P1) and its
Postgres transactions per create (P2), on a fresh local stack (issue 5 item 8)."""
