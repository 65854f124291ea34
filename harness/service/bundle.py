"""The run bundle: a gzip tarball with ``run.json`` and the run's ``allure-results/``.

The client packs one with :func:`make_bundle`; the service unpacks uploads with
:func:`safe_extract`, which trusts nothing in the archive. Each member is checked
before a byte of it is written: only regular files and directories, only under
``run.json`` or ``allure-results/``, no absolute paths or ``..``, no links or devices,
a bounded number of members and a bounded uncompressed size (counted on the
decompressed stream, so a lying header or a gzip bomb is stopped too). Extraction goes
into a staging directory that is renamed into place only once everything, run.json
included, has passed; a refused bundle leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import tarfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from harness.errors import HarnessError
from harness.results.model import RunRecord
from harness.service.layout import is_valid_run_id

RUN_JSON = "run.json"
RESULTS = "allure-results"

#: Tar headers, pax records and end-of-archive padding ride on top of the file data;
#: this much per member (and once per archive) is allowed beyond ``max_bytes`` before
#: the decompressed stream itself is cut off.
_PER_MEMBER_OVERHEAD = 3 * tarfile.BLOCKSIZE
_ARCHIVE_OVERHEAD = tarfile.RECORDSIZE + 64 * 1024
_COPY_CHUNK = 1 << 16


class BundleRejectedError(HarnessError):
    """An uploaded bundle that the service will not store; the message says why."""


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


def _extract_members(raw: BinaryIO, staging: Path, *, max_bytes: int,
                     max_members: int) -> tuple[int, int]:
    capped = _CappedReader(
        gzip.GzipFile(fileobj=raw, mode="rb"),
        max_bytes + _ARCHIVE_OVERHEAD + _PER_MEMBER_OVERHEAD * max_members)
    seen: set[str] = set()
    files = total = 0
    try:
        # Stream mode: each header is checked before its data is read, nothing seeks.
        with tarfile.open(fileobj=capped, mode="r|") as tar:
            for member in tar:
                if len(seen) >= max_members:
                    raise BundleTooLargeError(
                        f"the bundle has more than {max_members} members; the service "
                        "accepts up to its member limit")
                rel = _check_member(member, seen)
                seen.add(rel.as_posix())
                target = staging.joinpath(*rel.parts)
                if member.isdir():
                    _mkdir(target, member.name)
                    continue
                total += member.size
                if total > max_bytes:
                    raise BundleTooLargeError(
                        f"member {member.name!r} takes the bundle past {max_bytes} "
                        "unpacked bytes; the service accepts up to its max unpacked size")
                _write_member(tar, member, target)
                files += 1
    except BundleRejectedError:
        raise
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError) as exc:
        raise BundleRejectedError(
            f"the upload is not a readable gzip tarball ({exc}); build it with "
            "`harness upload` or harness.service.bundle.make_bundle") from exc
    if RUN_JSON not in seen:
        raise BundleRejectedError(f"the bundle has no {RUN_JSON} at its top level")
    if not any(name == RESULTS or name.startswith(f"{RESULTS}/") for name in seen):
        raise BundleRejectedError(f"the bundle has no {RESULTS}/ folder")
    return files, total


def _check_member(member: tarfile.TarInfo, seen: set[str]) -> PurePosixPath:
    """The member's path relative to the bundle root, or a refusal naming it."""
    name = member.name
    if not (member.isreg() or member.isdir()) or member.issparse():
        kind = ("symlink" if member.issym() else "hard link" if member.islnk()
                else "character device" if member.ischr() else "block device"
                if member.isblk() else "fifo" if member.isfifo() else "special member")
        raise BundleRejectedError(
            f"member {name!r} is a {kind}; a bundle holds only regular files and directories")
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise BundleRejectedError(f"member {name!r} has an absolute path")
    # GNU tar writes "./x"; that one prefix is harmless, any other "." or "" part is not.
    stripped = name[2:] if name.startswith("./") else name
    parts = stripped.rstrip("/").split("/") if member.isdir() else stripped.split("/")
    if ".." in parts:
        raise BundleRejectedError(f"member {name!r} has a '..' component")
    if any(part in {"", "."} for part in parts) or "\\" in stripped or "\0" in stripped:
        raise BundleRejectedError(f"member {name!r} is not a plain relative path")
    rel = PurePosixPath(*parts)
    if rel.as_posix() in seen:
        raise BundleRejectedError(f"member {name!r} appears twice")
    top = parts[0]
    if not (top == RESULTS or (parts == [RUN_JSON] and member.isreg())):
        raise BundleRejectedError(
            f"member {name!r} is outside {RUN_JSON} and {RESULTS}/; a bundle holds only those")
    if top == RESULTS and len(parts) == 1 and not member.isdir():
        raise BundleRejectedError(f"member {name!r} must be a directory")
    return rel


def _mkdir(target: Path, name: str) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise BundleRejectedError(f"member {name!r} collides with a file of the bundle") from exc


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    _mkdir(target.parent, member.name)
    source = tar.extractfile(member)
    if source is None:  # pragma: no cover - isreg() members always have data
        raise BundleRejectedError(f"member {member.name!r} has no data")
    # O_EXCL: a name the duplicate check missed still cannot overwrite; the member's
    # own mode bits are ignored (no setuid, no executables from an upload).
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        raise BundleRejectedError(
            f"member {member.name!r} collides with another member of the bundle") from exc
    with os.fdopen(fd, "wb") as handle:
        remaining = member.size
        while remaining > 0:
            chunk = source.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                raise BundleRejectedError(f"member {member.name!r} is truncated")
            handle.write(chunk)
            remaining -= len(chunk)


def _read_run(staging: Path) -> RunRecord:
    path = staging / RUN_JSON
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleRejectedError(f"{RUN_JSON} is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BundleRejectedError(f"{RUN_JSON} must hold a JSON object")
    try:
        run = RunRecord.from_json(body)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleRejectedError(
            f"{RUN_JSON} is not a valid run record ({type(exc).__name__}: {exc}); write it "
            "with the harness's RunRecord.to_json") from exc
    if not is_valid_run_id(run.run_id):
        raise BundleRejectedError(
            f"{RUN_JSON} has run_id {run.run_id!r}; use 1-128 letters, digits, '.', '-' or "
            "'_', starting with a letter or digit")
    return run
