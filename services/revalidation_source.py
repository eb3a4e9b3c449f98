"""Where validate/apply read a manifest's members from, a page at a time (bounded memory, NF-7).

A JSON Lines file (protocol.revalidation_lines) is checked whole when opened (invariant
1, before any transaction), keeping nothing but its head and making no member models
(each line is matched against the members' canonical spelling); each later pass over
its pages re-reads the file, parses it and checks it again, so a file changed in between
is refused inside the transaction (rolled back) rather than applied. A manifest already
in memory (a JSON document, or one `revalidate owner` built) is paged from memory.
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


class _Body:
    """The lines after the header: the members, then the trailer (kept), nothing after."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self.lines = lines
        self.trailer: bytes | None = None

    def __iter__(self) -> Iterator[bytes]:
        for line in self.lines:
            if self.trailer is not None:
                raise ManifestRejected(
                    ManifestRejectReason.INVALID_SHAPE, "lines after the trailer line"
                )
            if line.startswith(_TRAILER_START):
                self.trailer = line
            else:
                yield line


def _reader(stream: BinaryIO, *, reread: bool) -> tuple[ManifestLines, _Body]:
    lines = _lines(stream)
    header = next(lines, None)
    if header is None:
        raise ManifestRejected(ManifestRejectReason.INVALID_SHAPE, "the file is empty")
    return ManifestLines(header, reread=reread), _Body(lines)


def _check_whole(stream: BinaryIO) -> ManifestHead:
    """Invariant 1 over the whole file, member models not made (`ManifestLines.check`)."""
    reader, body = _reader(stream, reread=False)
    for line in body:
        reader.check(line)
    return reader.finish(body.trailer)


def _reread(stream: BinaryIO, size: int) -> Iterator[Sequence[RevalidationMember] | ManifestHead]:
    """Pages of members of a file checked whole before, then its head as read again."""
    reader, body = _reader(stream, reread=True)
    page: list[RevalidationMember] = []
    for line in body:
        page.append(reader.member(line))
        if len(page) == size:
            yield page
            page = []
    if page:
        yield page
    yield reader.finish(body.trailer)


class ManifestFile:
    """A JSON Lines manifest on disk, checked whole by `open`."""

    def __init__(self, path: Path, head: ManifestHead) -> None:
        self.path = path
        self._head = head

    @classmethod
    def open(cls, path: Path) -> ManifestFile:
        with path.open("rb") as stream:
            return cls(path, _check_whole(stream))

    @property
    def head(self) -> ManifestHead:
        return self._head

    def pages(self, size: int) -> Iterator[Sequence[RevalidationMember]]:
        with self.path.open("rb") as stream:
            # Checked whole by `open`: the digest at the end proves these are its bytes.
            for item in _reread(stream, size):
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
