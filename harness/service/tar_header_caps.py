"""A read-only ``tarfile.TarFile`` that caps what a bundle's tar headers make it read.

tarfile reads a GNU long name (type L/K) or a pax header (x/g/X) whole, with
``fileobj.read(size)`` for whatever size the header declares, in TarInfo._proc_gnulong
and _proc_pax, before any member is handed to us: a 200 MiB name is 200 MiB of memory
(and an error message quoting it) however small the upload. These private hooks are
the only place to see the declared size before that read; tarfile's own comments
name _proc_member and its _proc_* methods as the place for subclasses to extend.
Pre-parsing every 512-byte header in a reader layer would be the alternative, but it
would repeat tarfile's parsing (base-256 sizes, pax "size" overrides, sparse maps)
and could disagree with it. tests/test_service_tarballs.py fails if a Python upgrade
stops calling the hooks. The same hooks refuse sparse files before tarfile reads
their maps (GNU sparse 1.0 reads one in a loop bounded by nothing but the data).
"""

from __future__ import annotations

import tarfile
from typing import Any, Self

from harness.service.bundle import BundleRejectedError, BundleTooLargeError, quote_untrusted

#: The longest member name: Linux's PATH_MAX (4 KiB) less the NUL, which a GNU
#: long-name record counts.
MAX_NAME_BYTES = 4095
#: One pax header, extended or global; also all global ones together. make_bundle
#: writes a few hundred bytes for a long name.
MAX_PAX_BYTES = 64 * 1024
#: Extension headers (pax, GNU long name or link) in a row before one member. Real
#: archives have at most a global pax header, an extended one and a long name and
#: link; tarfile reads a chain by recursion, each level holding its header.
MAX_EXTENSIONS = 8

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


def _counters(tar: tarfile.TarFile) -> BundleTarFile:
    if not isinstance(tar, BundleTarFile):
        raise TypeError(f"_CappedTarInfo reads only through BundleTarFile, not {tar!r}")
    return tar


def _padded(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


class _CappedTarInfo(tarfile.TarInfo):
    """Refuses oversized extension headers before tarfile reads them (see the module
    docstring)."""

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
                f"the bundle has a damaged tar header at byte {start} "
                f"({quote_untrusted(exc)}); build it again with `harness upload`") from exc

    def _extension(self, tar: tarfile.TarFile, what: str, cap: int, capped: str) -> None:
        counters = _counters(tar)
        counters.extensions_in_a_row += 1
        if counters.extensions_in_a_row > MAX_EXTENSIONS:
            raise BundleRejectedError(
                f"the bundle has more than {MAX_EXTENSIONS} extension headers in a row "
                f"(at byte {self.offset}); a member has at most a few")
        if self.size > cap:
            raise BundleTooLargeError(
                f"the {what} at byte {self.offset} declares {self.size} bytes; the service "
                f"accepts {capped} of up to {cap} bytes")
        counters.header_bytes += _padded(self.size)

    def _proc_gnulong(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        kind = "name" if self.type == tarfile.GNUTYPE_LONGNAME else "link target"
        self._extension(tar, f"GNU long-{kind} record", MAX_NAME_BYTES + 1,
                        "member names (and their NUL)")
        return super()._proc_gnulong(tar)  # type: ignore[misc, no-any-return]

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        is_global = self.type == tarfile.XGLTYPE
        self._extension(tar, f"pax {'global' if is_global else 'extended'} header",
                        MAX_PAX_BYTES, "pax headers")
        if is_global:
            # Global headers add up for the rest of the archive, and tarfile copies
            # them into every member after.
            counters = _counters(tar)
            counters.global_pax_bytes += self.size
            if counters.global_pax_bytes > MAX_PAX_BYTES:
                raise BundleTooLargeError(
                    f"the bundle's pax global headers add up to more than {MAX_PAX_BYTES} "
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


class BundleTarFile(tarfile.TarFile):
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
        f"member {quote_untrusted(member.name)} is a sparse file (GNU sparse header); a "
        "bundle holds only regular files and directories")

