"""Whether a create's send journal proves that none of its tries landed (SPEC G-6, JRN-1).

An attempt parks `ambiguous_remote_effect` when a try may have landed: sent with no
answer yet, or an answer that proves nothing. The journal may prove more later: a try
that had outlived its activity's timeout is answered after the park, refused for good
or "not applied" (PROF-1). The seed keeps the attempt where it is (it leaves only by
reconciliation to a known remote id), but the operator must be told that there is no
object of ours to find: `links show`, the workflow's details and the remedy all read
this one judgement, made from the journal rows by `landing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final

from protocol.recovery import JournalEntry, SendKind, proves_no_effect


class Landing(StrEnum):
    """What the send journal says about the remote effect of a create or PATCH."""

    NO_TRY = "no_try"  # no try passed its fence: the journal proves nothing either way
    MAY_HAVE_LANDED = "may_have_landed"  # a try is in flight, unanswered, or proves nothing
    # At least one try, and every one never left or was answered refused for good or
    # "not applied": nothing this row sent created or changed anything at the remote.
    PROVED_NOT_LANDED = "proved_not_landed"


def landing(journal: Sequence[JournalEntry], kind: SendKind) -> Landing:
    """The journal's verdict, from its rows alone (the same rule as `may_have_landed`)."""
    if not journal:
        return Landing.NO_TRY
    if all(proves_no_effect(entry, kind) for entry in journal):
        return Landing.PROVED_NOT_LANDED
    return Landing.MAY_HAVE_LANDED


# How every surface states the proof (`links show`, the workflow's details, the remedy).
PROOF: Final = (
    "the send journal proves that no try of this create landed: every try was refused for"
    " good, answered with a status the frozen profile declares not applied (PROF-1), or"
    " never left; none is unanswered"
)
