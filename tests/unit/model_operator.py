"""Configuration changes and operator actions in the model-based test
(tests/unit/test_model_rules.py), in the shape of services/packs.py, services/operator.py
and services/revalidation_owner.py: the guards (`protocol.operator`) and the G-4 rule
(`protocol.restore_rule`) decide; a link these paths finalize or restore is checked
against the configuration itself (`Config.in_pack`), never against the rule under test."""

from __future__ import annotations

from dataclasses import replace

from protocol.admission import CreateReserved
from protocol.drift import INSTALL_REASONS, Disposition, DriftSurface, classify, suspend_reason
from protocol.errors import drift_reason
from protocol.gates import decide_admission
from protocol.messages import LinkView
from protocol.operator import OperatorAction, check_operator_action
from protocol.restore_rule import RestorePath, refusal, revalidated_link
from protocol.snapshots import LinkSnapshot
from protocol.states import AttemptStatus, LinkStatus, ProtocolError
from tests.unit.model_steps import admit, suspend
from tests.unit.model_world import (
    SLOT_A,
    SLOT_B,
    AttemptRow,
    Config,
    Install,
    LinkRow,
    World,
    admission_context,
    link_of,
    manifest,
    save_request,
)

A, L = AttemptStatus, LinkStatus
SLOT_GONE = drift_reason(DriftSurface.ACTION_RECREATED.value)
# What `revalidate-link` takes from the active install (`restore_rule.revalidated_link`).
REVALIDATED = ("last_validated_pack_install_id", "names", "profile", "action")


def edited(config: Config, change: str) -> Config:
    """`config` with one pack edit applied (each a new install, C-4)."""
    match change:
        case "mapping":
            return replace(config, mapping=config.mapping + 1)
        case "credential":
            return replace(config, credential=config.credential + 1)
        case "endpoint":
            return replace(config, endpoint=config.endpoint + 1)
        case "remove_a" | "remove_b":
            slot = SLOT_A if change == "remove_a" else SLOT_B
            return replace(config, removed=config.removed ^ {slot})
        case _:  # "same": the same pack applied again, still a new install
            return config


def guard_accepts(action: OperatorAction, view: LinkView) -> bool:
    try:
        check_operator_action(action, view)
    except ProtocolError:
        return False
    return True


def apply_pack(world: World, change: str, reinstall: bool) -> None:
    """`pack apply` of the pack with one edit: always a new install (C-4), on the same
    lineage unless `reinstall`; finalized links whose action slot it lacks are suspended
    at the apply (C-9)."""
    old = world.install
    ancestors = frozenset() if reinstall else old.ancestors | {old.install_id}
    world.install = Install(edited(old.config, change), f"install-{world.next_id()}", ancestors)
    slots = {s.id for s in manifest(world.install.config).action_slots}
    for link in world.rows.links.values():
        if link.status is L.FINALIZED and link.snap.slot.action_slot_id not in slots:
            suspend(world, link, SLOT_GONE)


def assert_in_pack(world: World, link: LinkSnapshot, path: RestorePath) -> None:
    slot = link.slot
    assert world.install.config.in_pack(slot.action_slot_id, slot.destination_slot_id), (
        f"{path.value} finalized {link.link_key} under a slot the active pack lacks"
    )


# -- attempts ----------------------------------------------------------------------


def ambiguous_with_an_object(world: World) -> list[tuple[AttemptRow, str]]:
    """Parked ambiguous attempts whose object the operator can find at the remote."""
    found = []
    for key in world.rows.link_keys():
        row = world.rows.newest_attempt(key)
        if row is not None and row.status is A.AMBIGUOUS_REMOTE_EFFECT:
            remote_id = world.remote.created_by(row.snap.attempt_id)
            if remote_id is not None:
                found.append((row, remote_id))
    return found


def reconcile(world: World, row: AttemptRow, remote_id: str) -> None:
    """services/operator.py `_reconcile`: G-4 first (nothing written on a refusal), the
    link born from the attempt, suspended at once when the active pack fails it closed."""
    key = row.snap.link_key
    if not guard_accepts(OperatorAction.RECONCILE, world.rows.view(key)):
        return
    active = world.install.active_for(row.snap)
    if refusal(row.snap, active, RestorePath.RECONCILE) is not None:
        return
    links = world.rows.links.values()
    if any(k.snap.remote_id == remote_id and k.status is not L.RETIRED for k in links):
        return  # ID-4: the id is another link's
    row.move(A.WRITEBACK_PENDING)
    row.move(A.FINALIZED)
    link = LinkRow(link_of(row.snap, remote_id))
    world.rows.links[key] = link
    assert_in_pack(world, link.snap, RestorePath.RECONCILE)
    closed = [f for f in classify(link.snap, active) if f.disposition is Disposition.FAIL_CLOSED]
    if closed:
        link.move(L.SUSPENDED_DRIFT, suspend_reason=suspend_reason(closed))


def newest_attempts(world: World, status: AttemptStatus) -> list[AttemptRow]:
    newest = (world.rows.newest_attempt(key) for key in world.rows.link_keys())
    return [row for row in newest if row is not None and row.status is status]


def supersede(world: World, row: AttemptRow) -> None:
    """services/operator.py `_supersede`: the next attempt is reserved by admission in the
    same transaction, or nothing changes."""
    key = row.snap.link_key
    if not guard_accepts(OperatorAction.SUPERSEDE, world.rows.view(key)):
        return
    before = row.snap
    row.move(A.SUPERSEDED)
    slot = row.snap.slot
    active = world.install.active(slot.action_slot_id, slot.destination_slot_id)
    n = world.next_id()
    request = save_request(slot.action_slot_id, slot.destination_slot_id)
    decision = (
        decide_admission(admission_context(world.rows, world.install, active, request, f"idem-{n}"))
        if active.usable
        else None
    )
    if isinstance(decision, CreateReserved):
        admit(world, decision, n)
    else:
        row.snap = before  # the transaction rolls back


def mark_terminal(world: World, row: AttemptRow) -> None:
    if guard_accepts(OperatorAction.MARK_TERMINAL, world.rows.view(row.snap.link_key)):
        row.move(A.TERMINAL_FAILED)


# -- links -------------------------------------------------------------------------


def links_in(world: World, *statuses: LinkStatus) -> list[LinkRow]:
    return [
        world.rows.links[k]
        for k in sorted(world.rows.links)
        if world.rows.links[k].status in statuses
    ]


def retire(world: World, link: LinkRow) -> None:
    if guard_accepts(OperatorAction.RETIRE, world.rows.view(link.snap.link_key)):
        link.move(L.RETIRED)


def revalidate_link(world: World, link: LinkRow) -> None:
    """services/operator.py `_revalidate`: the active install's names, profile and paths,
    if G-4 lets the link go back to work."""
    if not guard_accepts(OperatorAction.REVALIDATE, world.rows.view(link.snap.link_key)):
        return
    active = world.install.active_for(link.snap)
    if refusal(link.snap, active, RestorePath.REVALIDATE_LINK) is not None:
        return
    fresh = revalidated_link(link.snap, active)
    taken = {name: getattr(fresh, name) for name in REVALIDATED}
    link.move(L.FINALIZED, suspend_reason=None, **taken)
    assert_in_pack(world, link.snap, RestorePath.REVALIDATE_LINK)


def revalidate_owner(world: World) -> None:
    """services/revalidation_owner.py: every link G-4 lets through takes the install's
    receipt (validated install, mapping fingerprints); an install-change suspension is
    lifted."""
    for link in links_in(world, L.FINALIZED, L.SUSPENDED_DRIFT):
        active = world.install.active_for(link.snap)
        if refusal(link.snap, active, RestorePath.REVALIDATE_OWNER) is not None:
            continue
        fingerprints = active.action_snapshot().model_dump(
            include={"mapping_fingerprint", "body_fingerprint"}
        )
        receipt = {
            "last_validated_pack_install_id": world.install.install_id,
            "action": link.snap.action.model_copy(update=fingerprints),
        }
        if link.status is L.FINALIZED:
            link.snap = link.snap.model_copy(update=receipt)
        elif link.snap.suspend_reason in INSTALL_REASONS:
            link.move(L.FINALIZED, suspend_reason=None, **receipt)
            assert_in_pack(world, link.snap, RestorePath.REVALIDATE_OWNER)
