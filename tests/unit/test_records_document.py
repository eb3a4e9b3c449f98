"""Records documents are validated completely, naming the offending field."""

from __future__ import annotations

import pytest

from services.record_loader import RecordsFileInvalid, parse_records_document


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"records": [{"object": "contact", "id": "", "fields": {}}]}, "records[0].id"),
        ({"records": [{"object": "contact", "id": "c-9"}]}, "records[0].fields"),
        ({"records": [{"object": "contact", "id": "c-9", "fields": {}, "colour": 1}]}, "colour"),
        ({"grants": [{"object": "contact", "records": "*"}]}, "grants[0].user"),
        ({"grants": [{"user": "a", "object": "contact", "records": "all"}]}, "grants[0].records"),
        (
            {"records": [{"object": "c", "id": "1", "fields": {}}] * 2},
            "records[1]: duplicate record c/1",
        ),
        ([], "document"),
    ],
)
def test_invalid_document_names_the_field(document: object, named: str) -> None:
    with pytest.raises(RecordsFileInvalid) as caught:
        parse_records_document(document)
    assert named in str(caught.value)
