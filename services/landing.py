"""A parked ambiguous attempt's journal verdict on its view (SPEC G-6): the one judgement
(`protocol.landing.landing`) that `links show`, the workflow's details and the remedy
read, made from the attempt's send journal as Postgres holds it now."""

from __future__ import annotations

from db import journal as journal_q
from db.records import Conn
from protocol.landing import landing
from protocol.messages import LinkView
from protocol.recovery import SendKind
from protocol.states import AttemptStatus
from services.rows import journal_entries


async def with_landing(conn: Conn, view: LinkView) -> LinkView:
    """`view` with `attempt_landing` set when its newest attempt is parked ambiguous (the
    one state whose remedy depends on it); other views are returned as they are, so a
    create's or a PATCH's ordinary step reads nothing more."""
    if view.attempt_status is not AttemptStatus.AMBIGUOUS_REMOTE_EFFECT or not view.attempt_id:
        return view
    journal = journal_entries(await journal_q.attempt_journal(conn, view.attempt_id))
    return view.model_copy(update={"attempt_landing": landing(journal, SendKind.CREATE)})
