"""The PATCH path (SPEC PATCH-1..3, PAT, DRIFT-2, PROF-2): update only the object the
link owns, one module per step, the same steps as the create path (`services.create`):
`plan` (build the body under the current gates), `claim`, `send` (every request this
path makes leaves there), `answer` (what the remote's answer means), `apply` (the
state it leads to); `dispatch` runs them in order.

A PATCH is built at dispatch time from the latest record under the latest saver's
current authority, after the before-PATCH gates and the drift classifier passed
against the active pack. Fail-closed drift and remote 404/409 evidence suspend the
link; nothing here ever POSTs.

Every PATCH request, its first try and every re-send of a PATCH whose tries were all
definitely not applied (C-2'), and every read-back GET, passes the send gate
(`services.patch.gate`, SPEC §17 G-1) in the transaction that claims or checkpoints it.

Ambiguous PATCHes: a dispatch one of whose tries may have landed (its send journal,
`protocol.recovery`) is never sent again, replay-safe profile or not (SPEC §15 C-2).
A profile that declares a read-back may prove it applied with a GET (the object
holds the frozen body: `succeeded`, new ETag stored); otherwise, or when the read
differs, it ends `ambiguous_remote_effect`. The link stays `finalized` and
`NeedsOperator` stays false: every PATCH carries the full mapped state, so the next
save's PATCH converges the remote object whether or not the ambiguous one landed.
The dispatch stays visible in `links show` (PATCH history and send journal) and in
the workflow's details line.
"""
