"""connector-push protocol: the pure decision core (no I/O, clock, randomness or ids).

Theory of operation:
1. Identity. `identity.link_key` names the one durable owner of a (owner, action
   slot, source record, destination slot) push (ID-2); names never key anything.
2. Metadata. `manifest.parse_manifest` validates a pack (PACK-1);
   `active.resolve_active` resolves one slot of the active install by stable ids.
3. Admission. `gates.decide_admission` turns one save plus a snapshot of
   durable state into exactly one decision: reserve a create (frozen request,
   authority and association vector), reserve a deferred-association create,
   queue a PATCH, observe an active attempt, or reject with a `RejectReason`.
4. Remote effects. `outcome.interpret_post` / `resume_post` / `interpret_patch`
   say what may follow a send; a request is replayed only when the frozen
   profile declares it replay-safe, otherwise the attempt is ambiguous.
5. Drift. `drift.classify` compares frozen snapshots with the active pack, per
   the seed's matrix: finalized links suspend on fail-closed findings; attempts
   only ever use their frozen snapshots.
6. Lifecycles. `states` holds the transition tables the database enforces too.
"""
