"""Which tar members a run bundle may hold (pure: a header in, its path or a refusal out).

Only regular files and directories, only under ``run.json`` or ``allure-results/``, no
absolute paths or ``..``, no links or devices, names that are UTF-8 and that a
filesystem can store; the standard library's tar data filter then vets every member on
top of these checks.
"""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

from harness.service.bundle import (
    RESULTS,
    RUN_JSON,
    BundleRejectedError,
    BundleTooLargeError,
    quote_untrusted,
)
from harness.service.tar_header_caps import MAX_NAME_BYTES

#: Linux's NAME_MAX, for each part of a member's path.
_MAX_PART_BYTES = 255


def check_member(member: tarfile.TarInfo) -> PurePosixPath:
    """The member's path relative to the bundle root, or a refusal naming it."""
    name = member.name
    shown = quote_untrusted(name)
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        # A pax header may carry a name this long; a GNU long name is stopped earlier.
        raise BundleTooLargeError(
            f"member {shown} has a name over {MAX_NAME_BYTES} bytes; the service accepts "
            f"names up to {MAX_NAME_BYTES} bytes")
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


def apply_data_filter(member: tarfile.TarInfo, staging: Path) -> None:
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
                f"member {quote_untrusted(member.name)} is dropped by the tar data filter")
    except tarfile.FilterError as exc:
        raise BundleRejectedError(
            f"member {quote_untrusted(member.name)} is refused by the tar data filter "
            f"({quote_untrusted(exc)})") from exc

