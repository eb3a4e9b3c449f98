"""The create path (SPEC POST-1..4, REC-1..4, JRN-1, PROF-1), one module per step, the
same steps as the PATCH path (`services.patch`; a create's request was planned and
frozen at admission): `claim`, `send` (every request this path makes leaves there),
`answer` (what the remote's answer means), `apply` (the state it leads to);
`dispatch` runs them in order.

The claim reads the occupying attempt and its send journal first and lets
`protocol.recovery.next_step` decide what a (re)started step may do, so a retried
activity, a workflow reset or a zombie attempt can never send a second create: the
claim writes a fresh fencing token, and the checkpoint (`remote_io_started_at`, with
this try's journal row) is a compare-and-set on it right before the request. Every
outcome is recorded in the journal in the same transaction as the state it leads to.
"""
