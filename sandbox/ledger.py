"""The create ledger: every effect-bearing request of every mode, appended and committed."""

from __future__ import annotations

from sandbox.holder import StateHolder, now_iso
from sandbox.replies import sha256_hex
from sandbox.state import LedgerEntry, LedgerKind


def append_entry(
    holder: StateHolder,
    kind: LedgerKind,
    object_type: str,
    object_id: str | None,
    raw: bytes,
    status: int,
    unique_values: dict[str, str] | None = None,
    *,
    key: str | None = None,
    replayed: bool = False,
) -> None:
    """Append one entry (`raw`: the request body; `key`: the Idempotency-Key sent, honoured
    or not) and persist the state."""
    ledger = holder.state.ledger
    entry = LedgerEntry(
        seq=len(ledger) + 1,
        at=now_iso(),
        kind=kind,
        object_type=object_type,
        object_id=object_id,
        idempotency_key=key,
        body_sha256=sha256_hex(raw),
        unique_values=unique_values or {},
        replayed=replayed,
        status=status,
    )
    ledger.append(entry)
    holder.commit()
