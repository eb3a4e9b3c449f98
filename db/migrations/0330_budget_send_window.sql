-- SPEC NF-8' (PROF-3): each remote budget's send window, shared by every worker. `sent`
-- holds the instants (Postgres's clock) of the budget's last L requests, oldest first,
-- each recorded right before the request left. A request may leave only when the
-- L-th newest is at least the window plus a margin old, checked and recorded in one
-- statement under the budget's row lock (db/budget_pace.py TAKE_SEND_TURN), so no
-- window of sends exceeds the declared limit whichever worker sends and however late
-- it woke: 0150's slots space the sends, this bounds them. A worker that dies after its
-- record leaves a request counted that never went (a window under-spent, never over).
ALTER TABLE connector_budget_pace ADD COLUMN sent timestamptz[] NOT NULL DEFAULT '{}';
