"""Unpacking an uploaded run bundle into a folder, trusting nothing in the archive.

Each member is checked before a byte of it is written (``bundle_members``): only
regular files and directories, only under ``run.json`` or ``allure-results/``, no
absolute paths or ``..``, no links or devices, a bounded number of members and a bounded
uncompressed size (counted on the decompressed stream, so a lying header or a gzip bomb
is stopped too). Tar headers are bounded as well (``tar_header_caps``): a GNU long name
or a pax header is refused by its declared size before tarfile reads it, and header
bytes count toward the unpacked size. The standard library's tar data filter vets every
member on top of these checks, and the gzip stream is read to its end so its CRC and
length are verified. Extraction goes into a staging directory that is renamed into place
only once everything, run.json included, has passed; a refused bundle leaves nothing
behind.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from harness.results.run_record import RunRecord
from harness.results.run_schema import MAX_DOCUMENT_BYTES
from harness.results.run_validation import RunRecordError, parse_run_json
from harness.service.bundle import (
    RESULTS,
    RUN_JSON,
    BundleRejectedError,
    BundleTooLargeError,
    quote_untrusted,
)
from harness.service.bundle_members import apply_data_filter, check_member
from harness.service.tar_header_caps import MAX_EXTENSIONS, MAX_PAX_BYTES, BundleTarFile

#: What may follow the tar end marker: writers pad to a 10 KiB record with zeros.
_TRAILING_ALLOWANCE = 1 << 20
#: How far past ``max_bytes`` (file data and headers) the decompressed stream itself
#: is cut off: data padding to 512-byte blocks, per member; and once per archive the
#: end record, the trailing allowance with slack for one read, and one member's worth
#: of extension headers (read before they can be counted).
_PER_MEMBER_OVERHEAD = tarfile.BLOCKSIZE
_ARCHIVE_OVERHEAD = (2 * tarfile.RECORDSIZE + 2 * _TRAILING_ALLOWANCE
                     + MAX_EXTENSIONS * (MAX_PAX_BYTES + tarfile.BLOCKSIZE))
_COPY_CHUNK = 1 << 16


@dataclass(frozen=True)
class ExtractedBundle:
    root: Path
    run: RunRecord
    files: int
    total_bytes: int

    @property
    def results_dir(self) -> Path:
        return self.root / RESULTS


def safe_extract(source: Path | BinaryIO, dest: Path, *, max_bytes: int,
                 max_members: int) -> ExtractedBundle:
    """Unpack the bundle ``source`` into ``dest`` (which must not exist) after checking it.

    Raises :class:`BundleRejectedError` (:class:`BundleTooLargeError` for the limits)
    naming the offending member; ``dest`` is then not created and nothing is left in
    its parent directory.
    """
    if dest.exists():
        raise FileExistsError(f"{dest} exists; safe_extract needs a fresh destination")
    staging = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.partial")
    staging.mkdir(parents=True)
    try:
        with _open_source(source) as raw:
            files, total = _extract_members(raw, staging, max_bytes=max_bytes,
                                            max_members=max_members)
        run = _read_run(staging)
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExtractedBundle(root=dest, run=run, files=files, total_bytes=total)


def _open_source(source: Path | BinaryIO) -> contextlib.AbstractContextManager[BinaryIO]:
    if isinstance(source, Path):
        return source.open("rb")
    # The caller's stream: read it, leave closing it to the caller.
    return contextlib.nullcontext(source)


class _CappedReader(io.RawIOBase):
    """The decompressed stream, cut off once it passes ``limit`` bytes."""

    def __init__(self, inner: gzip.GzipFile, limit: int) -> None:
        self._inner = inner
        self._limit = limit
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        self.consumed += len(data)
        if self.consumed > self._limit:
            raise BundleTooLargeError(
                f"the bundle unpacks to more than {self._limit} bytes; the service accepts "
                "up to its max unpacked size (drop large attachments from the results)")
        buffer[:len(data)] = data
        return len(data)


def _extract_members(raw: BinaryIO, staging: Path, *, max_bytes: int,
                     max_members: int) -> tuple[int, int]:
    capped = _CappedReader(
        gzip.GzipFile(fileobj=raw, mode="rb"),
        max_bytes + _ARCHIVE_OVERHEAD + _PER_MEMBER_OVERHEAD * max_members)
    seen: set[bytes] = set()
    has_run = has_results = False
    files = data_bytes = 0
    try:
        # Stream mode: each header is checked before its data is read, nothing seeks.
        with BundleTarFile.open(fileobj=capped, mode="r|") as tar:
            while (member := tar.next()) is not None:
                if len(seen) >= max_members:
                    raise BundleTooLargeError(
                        f"the bundle has more than {max_members} members; the service "
                        "accepts up to its member limit")
                rel = check_member(member)
                key = _key(rel)
                if key in seen:
                    raise BundleRejectedError(
                        f"member {quote_untrusted(member.name)} appears twice")
                seen.add(key)
                apply_data_filter(member, staging)
                has_run = has_run or rel.parts == (RUN_JSON,)
                has_results = has_results or rel.parts[0] == RESULTS
                if member.isreg():
                    data_bytes += member.size
                if data_bytes + tar.header_bytes > max_bytes:
                    raise BundleTooLargeError(
                        f"member {quote_untrusted(member.name)} takes the bundle past {max_bytes} "
                        "unpacked bytes (file data and tar headers); the service accepts "
                        "up to its max unpacked size")
                target = staging.joinpath(*rel.parts)
                if member.isdir():
                    _mkdir(target, member.name)
                    continue
                _write_member(tar, member, target)
                files += 1
            _read_to_end(tar.fileobj)
    except BundleRejectedError:
        raise
    except (tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        raise _unreadable(exc, started=capped.consumed > 0) from exc
    if not has_run:
        raise BundleRejectedError(f"the bundle has no {RUN_JSON} at its top level")
    if not has_results:
        raise BundleRejectedError(f"the bundle has no {RESULTS}/ folder")
    return files, data_bytes


def _key(rel: PurePosixPath) -> bytes:
    # A digest, not the name, is kept per member: 50,000 names of 4 KiB would be 200 MB.
    return hashlib.blake2b(rel.as_posix().encode("utf-8", "surrogateescape"),
                           digest_size=16).digest()


class _Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


def _read_to_end(stream: _Readable) -> None:
    """Read what follows the tar end marker in ``stream`` to the end of the gzip stream.

    tarfile stops at the end marker, and GzipFile checks the CRC32 and length in the
    gzip trailer only on reaching it: without this a bundle cut short in its last gzip
    block, or with a wrong CRC, would be taken. ``stream`` is the tar's own stream
    (TarFile.fileobj), which still holds what tarfile read ahead past the marker.
    Only zero padding may follow, and a bounded amount of it, so appended data or a
    second gzip member carrying more is refused, not ignored.
    """
    left = _TRAILING_ALLOWANCE
    while chunk := stream.read(_COPY_CHUNK):
        left -= len(chunk)
        if left < 0:
            raise BundleRejectedError(
                f"the bundle has more than {_TRAILING_ALLOWANCE} bytes after its tar end "
                "marker; build it with `harness upload`, which writes only padding there")
        if chunk.count(0) != len(chunk):
            raise BundleRejectedError(
                "the bundle has data after its tar end marker; build it with `harness "
                "upload` (a second archive appended to a bundle is not read)")


def _unreadable(exc: BaseException, *, started: bool) -> BundleRejectedError:
    # A gzip stream that began well and then broke (or ends early) was cut short or
    # damaged on the way; one that never began is not a bundle at all.
    if isinstance(exc, EOFError) or (started and isinstance(exc, gzip.BadGzipFile | zlib.error)):
        return BundleRejectedError(
            f"the upload is not a complete gzip stream ({quote_untrusted(exc)}): it was cut short "
            "or damaged on the way, or has bytes after its end; send it again with "
            "`harness upload`")
    return BundleRejectedError(
        f"the upload is not a readable gzip tarball ({quote_untrusted(exc)}); build it with "
        "`harness upload` or harness.service.bundle.make_bundle")


def _mkdir(target: Path, name: str) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise BundleRejectedError(
            f"member {quote_untrusted(name)} collides with a file of the bundle") from exc
    except OSError as exc:
        raise _too_long(name, exc) from exc


def _too_long(name: str, exc: OSError) -> OSError | BundleRejectedError:
    # The name passed our checks but, under the service's data folder, makes a path
    # past PATH_MAX: the uploader's to fix, not a broken tarball.
    if exc.errno != errno.ENAMETOOLONG:
        return exc
    return BundleRejectedError(
        f"member {quote_untrusted(name)} makes a path longer than the service's filesystem allows; "
        "shorten its folder or file names")


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    _mkdir(target.parent, member.name)
    source = tar.extractfile(member)
    if source is None:  # pragma: no cover - isreg() members always have data
        raise BundleRejectedError(f"member {quote_untrusted(member.name)} has no data")
    # O_EXCL: a name the duplicate check missed still cannot overwrite; the member's
    # own mode bits are ignored (no setuid, no executables from an upload).
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        raise BundleRejectedError(
            f"member {quote_untrusted(member.name)} collides with another member of the bundle"
        ) from exc
    except OSError as exc:
        raise _too_long(member.name, exc) from exc
    with os.fdopen(fd, "wb") as handle:
        remaining = member.size
        while remaining > 0:
            chunk = source.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                raise BundleRejectedError(f"member {quote_untrusted(member.name)} is truncated")
            handle.write(chunk)
            remaining -= len(chunk)


def _read_run(staging: Path) -> RunRecord:
    """The bundle's run record, through the one run.json parser (refusals name the field)."""
    path = staging / RUN_JSON
    with path.open("rb") as handle:
        # One byte past the parser's limit is enough for it to refuse a huge file.
        data = handle.read(MAX_DOCUMENT_BYTES + 1)
    try:
        return parse_run_json(data, source=RUN_JSON)
    except RunRecordError as exc:
        raise BundleRejectedError(str(exc)) from exc
