"""The run bundle: a gzip tarball with ``run.json`` and the run's ``allure-results/``.

The client packs one with :func:`make_bundle`; the service unpacks uploads with
:func:`safe_extract`, which trusts nothing in the archive. Each member is checked
before a byte of it is written: only regular files and directories, only under
``run.json`` or ``allure-results/``, no absolute paths or ``..``, no links or devices,
a bounded number of members and a bounded uncompressed size (counted on the
decompressed stream, so a lying header or a gzip bomb is stopped too). Tar headers
are bounded as well: a GNU long name or a pax header is refused by its declared size
before tarfile reads it, and header bytes count toward the unpacked size. The
standard library's tar data filter vets every member on top of these checks, and the
gzip stream is read to its end so its CRC and length are verified. Extraction goes
into a staging directory that is renamed into place only once everything, run.json
included, has passed; a refused bundle leaves nothing behind. Refusals quote
untrusted names and error texts cut short (:func:`_shown`), so an error body stays
small whatever the upload holds.
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
from typing import Any, BinaryIO, Protocol, Self

from harness.errors import HarnessError
from harness.results.model import RunRecord
from harness.results.run_schema import MAX_DOCUMENT_BYTES, RunRecordError, parse_run_json

RUN_JSON = "run.json"
RESULTS = "allure-results"

#: The longest member name: Linux's PATH_MAX (4 KiB) less the NUL, which a GNU
#: long-name record counts.
_MAX_NAME_BYTES = 4095
#: Linux's NAME_MAX, for each part of a member's path.
_MAX_PART_BYTES = 255
#: One pax header, extended or global; also all global ones together. make_bundle
#: writes a few hundred bytes for a long name.
_MAX_PAX_BYTES = 64 * 1024
#: Extension headers (pax, GNU long name or link) in a row before one member. Real
#: archives have at most a global pax header, an extended one and a long name and
#: link; tarfile reads a chain by recursion, each level holding its header.
_MAX_EXTENSIONS = 8
#: What may follow the tar end marker: writers pad to a 10 KiB record with zeros.
_TRAILING_ALLOWANCE = 1 << 20
#: How far past ``max_bytes`` (file data and headers) the decompressed stream itself
#: is cut off: data padding to 512-byte blocks, per member; and once per archive the
#: end record, the trailing allowance with slack for one read, and one member's worth
#: of extension headers (read before they can be counted).
_PER_MEMBER_OVERHEAD = tarfile.BLOCKSIZE
_ARCHIVE_OVERHEAD = (2 * tarfile.RECORDSIZE + 2 * _TRAILING_ALLOWANCE
                     + _MAX_EXTENSIONS * (_MAX_PAX_BYTES + tarfile.BLOCKSIZE))
_COPY_CHUNK = 1 << 16
#: Untrusted text (a member name, an exception's message) quoted in a refusal is cut
#: to this many characters, and a whole message to this many UTF-8 bytes: the service
#: sends it back as the error body, which must stay far under 4 KiB.
_SHOWN_CHARS = 200
_MAX_MESSAGE_BYTES = 1500

# A header block that is neither a header nor the zero end block: tarfile takes it
# for the end of the archive (and drops it) unless told otherwise. Not in typeshed,
# but in tarfile since Python 3.2; tests/test_service_tarballs.py checks they exist.
# A ValueError is a number tarfile cannot parse (a pax record length of 5,000 digits),
# which it lets through as is.
_DAMAGED_HEADER: tuple[type[Exception], ...] = (
    tarfile.InvalidHeaderError,  # type: ignore[attr-defined]
    tarfile.TruncatedHeaderError,  # type: ignore[attr-defined]
    ValueError,
)


def _bounded(message: str) -> str:
    """``message`` with control characters escaped, cut to ``_MAX_MESSAGE_BYTES``."""
    head = message[:_MAX_MESSAGE_BYTES]
    if not head.isprintable():
        head = "".join(char if char.isprintable() else repr(char)[1:-1] for char in head)
    data = head.encode("utf-8", "backslashreplace")
    if len(message) <= _MAX_MESSAGE_BYTES and len(data) <= _MAX_MESSAGE_BYTES:
        return head
    return data[:_MAX_MESSAGE_BYTES].decode("utf-8", "ignore") + " … (message shortened)"


def _shown(text: object) -> str:
    """Untrusted ``text`` fit to quote in a refusal: cut to ``_SHOWN_CHARS`` characters.

    A name (a ``str``) is shown as its repr, which escapes control characters, as the
    messages always did; anything else (an exception) as its escaped text. A cut one
    says how long it really is.
    """
    raw = text if isinstance(text, str) else str(text)
    shown = repr(raw[:_SHOWN_CHARS])
    if not isinstance(text, str):
        shown = shown[1:-1]
    if len(raw) > _SHOWN_CHARS:
        shown += f"… ({len(raw)} characters)"
    return shown


class BundleRejectedError(HarnessError):
    """An uploaded bundle that the service will not store; the message says why.

    The message is bounded (:func:`_bounded`) whoever builds it: it goes back to the
    uploader as the error body and may quote what the upload holds.
    """

    def __init__(self, message: str) -> None:
        super().__init__(_bounded(message))


class BundleTooLargeError(BundleRejectedError):
    """A bundle over the service's size or member limits."""


@dataclass(frozen=True)
class ExtractedBundle:
    root: Path
    run: RunRecord
    files: int
    total_bytes: int

    @property
    def results_dir(self) -> Path:
        return self.root / RESULTS


def make_bundle(run_json: Path, results_dir: Path, out: Path) -> Path:
    """Pack ``run_json`` and ``results_dir`` into the gzip tarball ``out``.

    Only regular files and directories go in (the service refuses anything else), with
    owner and times zeroed so the same inputs make the same archive.
    """
    if not run_json.is_file():
        raise BundleRejectedError(f"{run_json}: no such run.json; pass the run.json the "
                                  "harness wrote for the run")
    if not results_dir.is_dir():
        raise BundleRejectedError(f"{results_dir}: no such allure results directory; pass "
                                  "the --alluredir of the run")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.add(run_json, arcname=RUN_JSON, recursive=False, filter=_normalise)
        tar.add(results_dir, arcname=RESULTS, recursive=False, filter=_normalise)
        for path in sorted(results_dir.rglob("*")):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise BundleRejectedError(
                    f"{path}: not a regular file or directory; the bundle carries only "
                    "plain files, so remove it from the results directory")
            arcname = f"{RESULTS}/{path.relative_to(results_dir).as_posix()}"
            tar.add(path, arcname=arcname, recursive=False, filter=_normalise)
    return out


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    info.mode = 0o755 if info.isdir() else 0o644
    return info


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


# -- tar headers ---------------------------------------------------------------------
#
# tarfile reads a GNU long name (type L/K) or a pax header (x/g/X) whole, with
# ``fileobj.read(size)`` for whatever size the header declares, in TarInfo._proc_gnulong
# and _proc_pax, before any member is handed to us: a 200 MiB name is 200 MiB of memory
# (and an error message quoting it) however small the upload. These private hooks are
# the only place to see the declared size before that read; tarfile's own comments
# name _proc_member and its _proc_* methods as the place for subclasses to extend.
# Pre-parsing every 512-byte header in a reader layer would be the alternative, but it
# would repeat tarfile's parsing (base-256 sizes, pax "size" overrides, sparse maps)
# and could disagree with it. tests/test_service_tarballs.py fails if a Python upgrade
# stops calling the hooks. The same hooks refuse sparse files before tarfile reads
# their maps (GNU sparse 1.0 reads one in a loop bounded by nothing but the data).


def _counters(tar: tarfile.TarFile) -> _BundleTarFile:
    if not isinstance(tar, _BundleTarFile):
        raise TypeError(f"_CappedTarInfo reads only through _BundleTarFile, not {tar!r}")
    return tar


def _padded(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


class _CappedTarInfo(tarfile.TarInfo):
    """Refuses oversized extension headers before tarfile reads them (see above)."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> Self:
        counters = _counters(tar)
        start = tar.fileobj.tell()
        counters.header_bytes += tarfile.BLOCKSIZE
        try:
            return super().fromtarfile(tar)
        except _DAMAGED_HEADER as exc:
            # tarfile would end the archive here and drop the block unseen.
            raise BundleRejectedError(
                f"the bundle has a damaged tar header at byte {start} ({_shown(exc)}); "
                "build it again with `harness upload`") from exc

    def _extension(self, tar: tarfile.TarFile, what: str, cap: int, capped: str) -> None:
        counters = _counters(tar)
        counters.extensions_in_a_row += 1
        if counters.extensions_in_a_row > _MAX_EXTENSIONS:
            raise BundleRejectedError(
                f"the bundle has more than {_MAX_EXTENSIONS} extension headers in a row "
                f"(at byte {self.offset}); a member has at most a few")
        if self.size > cap:
            raise BundleTooLargeError(
                f"the {what} at byte {self.offset} declares {self.size} bytes; the service "
                f"accepts {capped} of up to {cap} bytes")
        counters.header_bytes += _padded(self.size)

    def _proc_gnulong(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        kind = "name" if self.type == tarfile.GNUTYPE_LONGNAME else "link target"
        self._extension(tar, f"GNU long-{kind} record", _MAX_NAME_BYTES + 1,
                        "member names (and their NUL)")
        return super()._proc_gnulong(tar)  # type: ignore[misc, no-any-return]

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        is_global = self.type == tarfile.XGLTYPE
        self._extension(tar, f"pax {'global' if is_global else 'extended'} header",
                        _MAX_PAX_BYTES, "pax headers")
        if is_global:
            # Global headers add up for the rest of the archive, and tarfile copies
            # them into every member after.
            counters = _counters(tar)
            counters.global_pax_bytes += self.size
            if counters.global_pax_bytes > _MAX_PAX_BYTES:
                raise BundleTooLargeError(
                    f"the bundle's pax global headers add up to more than {_MAX_PAX_BYTES} "
                    f"bytes (at byte {self.offset}); the service accepts up to that")
        return super()._proc_pax(tar)  # type: ignore[misc, no-any-return]

    def _proc_sparse(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        raise _sparse(self)

    # GNU sparse formats 0.0, 0.1 and 1.0, carried in pax headers; ``member`` is the
    # member the pax header describes.
    def _proc_gnusparse_00(self, member: tarfile.TarInfo, *_: object) -> None:
        raise _sparse(member)

    def _proc_gnusparse_01(self, member: tarfile.TarInfo, *_: object) -> None:
        raise _sparse(member)

    def _proc_gnusparse_10(self, member: tarfile.TarInfo, *_: object) -> None:
        raise _sparse(member)


class _BundleTarFile(tarfile.TarFile):
    """A TarFile that counts and caps what its headers make it read (reading only)."""

    tarinfo = _CappedTarInfo
    #: Declared so that mypy knows it: TarFile keeps every member read so far.
    members: list[tarfile.TarInfo]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before TarFile.__init__, which reads the first header.
        #: Header blocks and extension header data read so far.
        self.header_bytes = 0
        self.global_pax_bytes = 0
        self.extensions_in_a_row = 0
        super().__init__(*args, **kwargs)

    def next(self) -> tarfile.TarInfo | None:
        self.extensions_in_a_row = 0
        member = super().next()
        # TarFile keeps the members it read for getmembers(); a stream read once does
        # not need them, and 50,000 names of 4 KiB would hold 200 MB until the end.
        self.members.clear()
        return member


def _sparse(member: tarfile.TarInfo) -> BundleRejectedError:
    return BundleRejectedError(
        f"member {_shown(member.name)} is a sparse file (GNU sparse header); a bundle "
        "holds only regular files and directories")


# -- extraction ------------------------------------------------------------------------

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
        with _BundleTarFile.open(fileobj=capped, mode="r|") as tar:
            while (member := tar.next()) is not None:
                if len(seen) >= max_members:
                    raise BundleTooLargeError(
                        f"the bundle has more than {max_members} members; the service "
                        "accepts up to its member limit")
                rel = _check_member(member)
                key = _key(rel)
                if key in seen:
                    raise BundleRejectedError(f"member {_shown(member.name)} appears twice")
                seen.add(key)
                _apply_data_filter(member, staging)
                has_run = has_run or rel.parts == (RUN_JSON,)
                has_results = has_results or rel.parts[0] == RESULTS
                if member.isreg():
                    data_bytes += member.size
                if data_bytes + tar.header_bytes > max_bytes:
                    raise BundleTooLargeError(
                        f"member {_shown(member.name)} takes the bundle past {max_bytes} "
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
            f"the upload is not a complete gzip stream ({_shown(exc)}): it was cut short "
            "or damaged on the way, or has bytes after its end; send it again with "
            "`harness upload`")
    return BundleRejectedError(
        f"the upload is not a readable gzip tarball ({_shown(exc)}); build it with "
        "`harness upload` or harness.service.bundle.make_bundle")


def _apply_data_filter(member: tarfile.TarInfo, staging: Path) -> None:
    """The standard library's ``data`` extraction filter, as a second opinion.

    Our own checks are stricter and come first (their messages say more); the filter
    guards against whatever they miss. Only its verdict is used: files are written
    0644 by us whatever mode the filter would keep.
    """
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # pragma: no cover - Python 3.11.0-3.11.3
        raise BundleRejectedError(
            "this service's Python has no tarfile.data_filter; run it on Python 3.11.4 "
            "or later")
    try:
        if data_filter(member, str(staging)) is None:
            raise BundleRejectedError(
                f"member {_shown(member.name)} is dropped by the tar data filter")
    except tarfile.FilterError as exc:
        raise BundleRejectedError(
            f"member {_shown(member.name)} is refused by the tar data filter "
            f"({_shown(exc)})") from exc


def _check_member(member: tarfile.TarInfo) -> PurePosixPath:
    """The member's path relative to the bundle root, or a refusal naming it."""
    name = member.name
    shown = _shown(name)
    if len(name.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
        # A pax header may carry a name this long; a GNU long name is stopped earlier.
        raise BundleTooLargeError(
            f"member {shown} has a name over {_MAX_NAME_BYTES} bytes; the service accepts "
            f"names up to {_MAX_NAME_BYTES} bytes")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # tarfile decodes names with surrogateescape: bytes that are not UTF-8 arrive as
        # lone surrogates, which no JSON answer, report or database can carry later.
        raise BundleRejectedError(
            f"member {shown} has a name that is not UTF-8; name the results' files in "
            "UTF-8 (allure-pytest does)") from None
    if not (member.isreg() or member.isdir()) or member.issparse():
        kind = ("symlink" if member.issym() else "hard link" if member.islnk()
                else "character device" if member.ischr() else "block device"
                if member.isblk() else "fifo" if member.isfifo() else "special member")
        raise BundleRejectedError(
            f"member {shown} is a {kind}; a bundle holds only regular files and directories")
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise BundleRejectedError(f"member {shown} has an absolute path")
    # GNU tar writes "./x"; that one prefix is harmless, any other "." or "" part is not.
    stripped = name[2:] if name.startswith("./") else name
    parts = stripped.rstrip("/").split("/") if member.isdir() else stripped.split("/")
    if ".." in parts:
        raise BundleRejectedError(f"member {shown} has a '..' component")
    if any(part in {"", "."} for part in parts) or "\\" in stripped or "\0" in stripped:
        raise BundleRejectedError(f"member {shown} is not a plain relative path")
    if any(len(part.encode("utf-8", "surrogateescape")) > _MAX_PART_BYTES for part in parts):
        raise BundleRejectedError(
            f"member {shown} has a path part over {_MAX_PART_BYTES} bytes, which no "
            "filesystem stores; shorten that file or folder name")
    top = parts[0]
    if not (top == RESULTS or (parts == [RUN_JSON] and member.isreg())):
        raise BundleRejectedError(
            f"member {shown} is outside {RUN_JSON} and {RESULTS}/; a bundle holds only those")
    if top == RESULTS and len(parts) == 1 and not member.isdir():
        raise BundleRejectedError(f"member {shown} must be a directory")
    return PurePosixPath(*parts)


def _mkdir(target: Path, name: str) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise BundleRejectedError(
            f"member {_shown(name)} collides with a file of the bundle") from exc
    except OSError as exc:
        raise _too_long(name, exc) from exc


def _too_long(name: str, exc: OSError) -> OSError | BundleRejectedError:
    # The name passed our checks but, under the service's data folder, makes a path
    # past PATH_MAX: the uploader's to fix, not a broken tarball.
    if exc.errno != errno.ENAMETOOLONG:
        return exc
    return BundleRejectedError(
        f"member {_shown(name)} makes a path longer than the service's filesystem allows; "
        "shorten its folder or file names")


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    _mkdir(target.parent, member.name)
    source = tar.extractfile(member)
    if source is None:  # pragma: no cover - isreg() members always have data
        raise BundleRejectedError(f"member {_shown(member.name)} has no data")
    # O_EXCL: a name the duplicate check missed still cannot overwrite; the member's
    # own mode bits are ignored (no setuid, no executables from an upload).
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        raise BundleRejectedError(
            f"member {_shown(member.name)} collides with another member of the bundle"
        ) from exc
    except OSError as exc:
        raise _too_long(member.name, exc) from exc
    with os.fdopen(fd, "wb") as handle:
        remaining = member.size
        while remaining > 0:
            chunk = source.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                raise BundleRejectedError(f"member {_shown(member.name)} is truncated")
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
