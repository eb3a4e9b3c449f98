"""Where validate/apply read a manifest's members from, a page at a time (issue 34).

A JSON Lines file (protocol.revalidation_lines) is checked whole when opened (invariant
1, before any transaction), keeping nothing but its head; each later pass over its pages
re-reads the file and checks it again, so a file changed in between is refused inside
the transaction (rolled back) rather than applied. A manifest already in memory (a JSON
document, or one `revalidate owner` built) is paged from memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Final, Protocol

from protocol.revalidation_lines import ManifestLines
from protocol.revalidation_manifest import (
    ManifestHead,
    ManifestRejected,
    ManifestRejectReason,
    RevalidationManifest,
    RevalidationMember,
)

# Canonical JSON sorts keys: the trailer is the only line that starts with this.
_TRAILER_START: Final = b'{"manifest_digest":'


class ManifestSource(Protocol):
    """A checked manifest: its head, and its members in link-key order, page by page."""

    @property
    def head(self) -> ManifestHead: ...

    def pages(self, size: int) -> Iterator[Sequence[RevalidationMember]]: ...


class ManifestInMemory:
    def __init__(self, manifest: RevalidationManifest) -> None:
        self.manifest = manifest

    @property
    def head(self) -> ManifestHead:
        return self.manifest.head

    def pages(self, size: int) -> Iterator[Sequence[RevalidationMember]]:
        members = self.manifest.members
        for start in range(0, len(members), size):
            yield members[start : start + size]


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        yield line.removesuffix(b"\n")


def _check(
    stream: BinaryIO, size: int, *, reread: bool = False
) -> Iterator[Sequence[RevalidationMember] | ManifestHead]:
    """Pages of checked members, then the checked head (ManifestRejected at a problem)."""
    lines = _lines(stream)
    header = next(lines, None)
    if header is None:
        raise ManifestRejected(ManifestRejectReason.INVALID_SHAPE, "the file is empty")
    reader = ManifestLines(header, reread=reread)
    page: list[RevalidationMember] = []
    trailer: bytes | None = None
    for line in lines:
        if trailer is not None:
            raise ManifestRejected(
                ManifestRejectReason.INVALID_SHAPE, "lines after the trailer line"
            )
        if line.startswith(_TRAILER_START):
            trailer = line
            continue
        page.append(reader.member(line))
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page
    yield reader.finish(trailer)


class ManifestFile:
    """A JSON Lines manifest on disk, checked whole by `open`."""

    def __init__(self, path: Path, head: ManifestHead) -> None:
        self.path = path
        self._head = head

    @classmethod
    def open(cls, path: Path, check_page: int = 5000) -> ManifestFile:
        with path.open("rb") as stream:
            for item in _check(stream, check_page):
                if isinstance(item, ManifestHead):
                    return cls(path, item)
        raise AssertionError("_check ends with the head")  # pragma: no cover

    @property
    def head(self) -> ManifestHead:
        return self._head

    def pages(self, size: int) -> Iterator[Sequence[RevalidationMember]]:
        with self.path.open("rb") as stream:
            # Checked whole by `open`: the digest at the end proves these are its bytes.
            for item in _check(stream, size, reread=True):
                if isinstance(item, ManifestHead):
                    if (item.manifest_digest, item.member_count) != (
                        self._head.manifest_digest,
                        self._head.member_count,
                    ):
                        raise ManifestRejected(
                            ManifestRejectReason.DIGEST_MISMATCH,
                            f"{self.path} changed after it was checked",
                        )
                    return
                yield item


def as_source(manifest: RevalidationManifest | ManifestSource) -> ManifestSource:
    if isinstance(manifest, RevalidationManifest):
        return ManifestInMemory(manifest)
    return manifest
