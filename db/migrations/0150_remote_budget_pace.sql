-- Issue 33 items 1 and 2 (SPEC NF-8, PROF-3): each remote budget's burst-window pace,
-- shared by every worker. `next_free` is the instant the budget's next request may
-- leave (a GCRA: one request per interval, a bounded catch-up after idle). A worker
-- reserves a slot in one UPSERT (db/budget_pace.py) and waits for it before sending, so
-- two workers never take the same slot, and a worker that dies after reserving leaves
-- its slot unused: a death can under-spend a window, never over-spend it.
CREATE TABLE connector_budget_pace (
    budget_key text PRIMARY KEY,
    next_free timestamptz NOT NULL
);
