"""`make chaos`: a seeded, randomized fault campaign over the demo pack (issue 10, SPEC §14).

A private stack (embedded Postgres, Temporal dev server, the sandbox remote and
worker subprocesses) is driven with concurrent saves, record edits and operator
actions while sandbox faults and process restarts are injected. After a settle
phase a checker that trusts only the sandbox ledger and SQL (plus the Temporal
visibility query an operator uses) lists every broken guarantee.
"""
