"""Hostile and broken uploads: each is refused with a 4xx and leaves nothing behind.

The tarballs are crafted here with tarfile, member by member, so each carries exactly
one thing wrong; "nothing behind" means no run folder, no temp leftovers and no row.
What tarfile will not write (lying headers, header bombs, broken gzip trailers) is
put together from raw blocks. The first part drives ``safe_extract`` directly, the
second posts to a live service; the header bombs of issue 12 (a 200 MiB GNU long name,
a 100 MiB pax header) go to both, under the service's default limits.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import os
import stat
import tarfile
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from results_fixtures import make_run, store_url  # noqa: F401 - store_url is a fixture
from service_helpers import no_report, tmp_leftovers
from starlette.applications import Starlette

from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import BundleRejectedError, BundleTooLargeError, make_bundle
from harness.service.bundle_extract import safe_extract
from harness.service.settings import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_UNPACKED_BYTES,
    ServiceSettings,
)

TOKEN = "tarball-token-" + "y" * 20
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/gzip"}
MAX_UPLOAD = 64 * 1024
MAX_UNPACKED = 256 * 1024
MAX_MEMBERS = 40
MIB = 1 << 20

RUN_JSON = json.dumps(make_run("crafted").to_json()).encode()
RESULT = b'{"uuid": "1", "name": "test_a", "status": "passed"}'


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, b""


def _dir(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return _special(name, tarfile.DIRTYPE)


GOOD = [_file("run.json", RUN_JSON), _dir("allure-results"),
        _file("allure-results/1-result.json", RESULT)]


def tarball(members: list[tuple[tarfile.TarInfo, bytes]], *, compress: bool = True,
            format: int = tarfile.GNU_FORMAT) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=format) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue()) if compress else raw.getvalue()


# -- hand-made tar records, for what tarfile will not write ---------------------------

#: The tar end marker: two zero blocks.
END = bytes(2 * tarfile.BLOCKSIZE)


def records(members: list[tuple[tarfile.TarInfo, bytes]],
            format: int = tarfile.GNU_FORMAT) -> bytes:
    """The tar records of ``members`` with no end marker, so that more can follow."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=format) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
        end = tar.offset
    return raw.getvalue()[:end]


def header(name: str, kind: bytes, size: int) -> bytes:
    """One 512-byte header block declaring ``size`` bytes of data, which may be a lie."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % tarfile.BLOCKSIZE)


def pax(kind: bytes, key: str, value: str) -> bytes:
    """A pax header (``kind`` x or g) holding one record, with its data."""
    body = f" {key}={value}\n".encode()
    length = len(body) + len(str(len(body)))
    length = len(body) + len(str(length))  # the length counts its own digits
    record = str(length).encode() + body
    return header("././@PaxHeader", kind, len(record)) + padded(record)


def name_of(length: int) -> str:
    """A name under allure-results/ of ``length`` characters, no part over 200."""
    name = f"{RESULTS_DIR}/"
    while len(name) + 201 < length:
        name += "a" * 200 + "/"
    return name + "b" * (length - len(name))


def with_pax(name: str, headers: dict[str, str], data: bytes = b"") -> tuple[
        tarfile.TarInfo, bytes]:
    info, data = _file(name, data)
    info.pax_headers = headers
    return info, data


RESULTS_DIR = "allure-results"
GOOD_GZ = tarball(GOOD)


def flipped(body: bytes, index: int) -> bytes:
    changed = bytearray(body)
    changed[index] ^= 0xFF
    return bytes(changed)


# (id, tarball, expected status, text the reason must contain)
REFUSED = [
    ("absolute", tarball([*GOOD, _file("/tmp/evil", b"x")]), 422, "'/tmp/evil'"),
    ("dotdot", tarball([*GOOD, _file("../evil", b"x")]), 422, "'../evil'"),
    ("dotdot-inside", tarball([*GOOD, _file("allure-results/../../evil", b"x")]), 422,
     "'allure-results/../../evil'"),
    ("symlink", tarball([*GOOD, _special("allure-results/link", tarfile.SYMTYPE,
                                         "/etc/passwd")]), 422, "symlink"),
    ("hardlink", tarball([*GOOD, _special("allure-results/hard", tarfile.LNKTYPE,
                                          "run.json")]), 422, "hard link"),
    ("chardev", tarball([*GOOD, _special("allure-results/tty", tarfile.CHRTYPE)]), 422,
     "character device"),
    ("blockdev", tarball([*GOOD, _special("allure-results/sda", tarfile.BLKTYPE)]), 422,
     "block device"),
    ("fifo", tarball([*GOOD, _special("allure-results/pipe", tarfile.FIFOTYPE)]), 422,
     "fifo"),
    ("outside", tarball([*GOOD, _file("notes.txt", b"x")]), 422, "'notes.txt'"),
    ("outside-dir", tarball([*GOOD, _file("reports/x.json", b"x")]), 422, "'reports/x.json'"),
    ("results-as-file", tarball([GOOD[0], _file("allure-results", b"x")]), 422,
     "'allure-results'"),
    ("duplicate", tarball([*GOOD, _file("allure-results/1-result.json", b"{}")]), 422,
     "appears twice"),
    ("file-then-child", tarball([*GOOD, _file("allure-results/x", b"1"),
                                 _file("allure-results/x/y", b"2")]), 422, "collides"),
    ("missing-run-json", tarball(GOOD[1:]), 422, "no run.json"),
    ("missing-results", tarball(GOOD[:1]), 422, "no allure-results/"),
    ("run-json-not-json", tarball([_file("run.json", b"{nope"), *GOOD[1:]]), 422,
     "not valid JSON"),
    ("run-json-not-a-run", tarball([_file("run.json", b'{"run_id": "x"}'), *GOOD[1:]]),
     422, "not a harness run record"),
    ("run-json-bad-id", tarball([
        _file("run.json", json.dumps(make_run("../../etc").to_json()).encode()),
        *GOOD[1:]]), 422, "'../../etc'"),
    ("not-gzip", tarball(GOOD, compress=False), 422, "not a readable gzip tarball"),
    ("garbage", os.urandom(2048), 422, "not a readable gzip tarball"),
    ("bomb", tarball([*GOOD, _file("allure-results/zeros", bytes(4 * MAX_UNPACKED))]), 413,
     "unpacked"),
    # tarfile would read the name whole before any member check: refused by the size
    # its GNU long-name record declares, before that read.
    ("huge-name-header", tarball([*GOOD, _file("allure-results/" + "a" * (4 * MAX_UNPACKED),
                                               b"x")]), 413, "GNU long-name record"),
    ("truncated", gzip.compress(tarball([*GOOD, _file("allure-results/big", bytes(8192))],
                                        compress=False)[:4096]), 422,
     "not a readable gzip tarball"),
    ("too-many-members", tarball([*GOOD, *(_file(f"allure-results/{i}.json", b"{}")
                                           for i in range(MAX_MEMBERS))]), 413, "members"),
    # Headers: each of these is refused by a TarInfo hook in tar_header_caps.py before
    # tarfile reads what the header declares; the reason is the hook's own, so these fail if a
    # Python upgrade stops calling _proc_gnulong / _proc_pax / _proc_sparse /
    # _proc_gnusparse_* (the member checks would refuse some later, with another text).
    ("long-name-4096", tarball([*GOOD, _file(name_of(4096), b"x")]), 413,
     "GNU long-name record"),
    ("long-link", gzip.compress(records(GOOD) + header("././@LongLink",
                                                       tarfile.GNUTYPE_LONGLINK, 8 * 1024)
                                + bytes(8 * 1024) + END), 413, "GNU long-link target"),
    ("pax-header-over-64k", gzip.compress(
        records(GOOD) + pax(tarfile.XHDTYPE, "comment", "c" * (64 * 1024)) + END), 413,
     "pax extended header"),
    ("pax-global-over-64k", gzip.compress(
        pax(tarfile.XGLTYPE, "comment", "c" * (64 * 1024)) + records(GOOD) + END), 413,
     "pax global header"),
    ("pax-globals-add-up", gzip.compress(
        pax(tarfile.XGLTYPE, "comment", "c" * 40_000)
        + pax(tarfile.XGLTYPE, "hdrcharset", "c" * 40_000) + records(GOOD) + END), 413,
     "global headers add up"),
    ("pax-name-4096", tarball([*GOOD, with_pax("x", {"path": name_of(4096)})],
                              format=tarfile.PAX_FORMAT), 413, "has a name over 4095"),
    ("extension-chain", gzip.compress(
        records(GOOD) + pax(tarfile.XHDTYPE, "comment", "c") * 9
        + header("allure-results/x", tarfile.REGTYPE, 0) + END), 422,
     "extension headers in a row"),
    ("gnu-sparse", gzip.compress(records(GOOD) + header("allure-results/s",
                                                        tarfile.GNUTYPE_SPARSE, 0) + END),
     422, "sparse file (GNU sparse header)"),
    *((f"pax-sparse-{version}", tarball([*GOOD, with_pax("allure-results/s", headers)],
                                        format=tarfile.PAX_FORMAT),
       422, "sparse file (GNU sparse header)")
      for version, headers in [("0.0", {"GNU.sparse.size": "1"}),
                               ("0.1", {"GNU.sparse.map": "0,1"}),
                               ("1.0", {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"})]),
    ("long-part", tarball([*GOOD, _file("allure-results/" + "p" * 256, b"x")]), 422,
     "path part over 255 bytes"),
    # The gzip trailer (CRC32, length) is read and checked, not skipped.
    ("gzip-cut-8", GOOD_GZ[:-8], 422, "not a complete gzip stream"),
    ("gzip-cut-4", GOOD_GZ[:-4], 422, "not a complete gzip stream"),
    ("gzip-cut-1", GOOD_GZ[:-1], 422, "not a complete gzip stream"),
    ("gzip-wrong-crc", flipped(GOOD_GZ, -8), 422, "not a complete gzip stream"),
    ("gzip-wrong-length", flipped(GOOD_GZ, -4), 422, "not a complete gzip stream"),
    ("garbage-after-gzip", GOOD_GZ + b"not gzip", 422, "not a complete gzip stream"),
    # After the tar end marker only zero padding, and not much of it.
    ("data-after-end", gzip.compress(records(GOOD) + END + b"x" * 100), 422,
     "data after its tar end marker"),
    ("archive-appended", GOOD_GZ + tarball([_file("allure-results/2.json", RESULT)]), 422,
     "data after its tar end marker"),
    ("zeros-after-end", gzip.compress(tarball(GOOD, compress=False) + bytes(2 * MIB)), 422,
     "more than 1048576 bytes after its tar end marker"),
    # tarfile takes a block that is no header for the end of the archive.
    ("damaged-header", gzip.compress(records(GOOD) + b"\x01" * tarfile.BLOCKSIZE + END),
     422, "damaged tar header"),
    # ... and lets a ValueError through for a number past Python's 4300 digits.
    ("pax-length-5000-digits", gzip.compress(
        records(GOOD) + header("././@PaxHeader", tarfile.XHDTYPE, 5005)
        + padded(b"9" * 5000 + b" a=b\n") + header("allure-results/x", tarfile.REGTYPE, 0)
        + END), 422, "damaged tar header"),
]


def test_the_bomb_is_small_compressed() -> None:
    bomb = dict((case[0], case[1]) for case in REFUSED)["bomb"]
    assert len(bomb) < MAX_UPLOAD // 8  # only the unpacked size can catch it


# -- safe_extract on its own -------------------------------------------------------

@pytest.mark.parametrize(("body", "status", "reason"),
                         [pytest.param(b, s, r, id=i) for i, b, s, r in REFUSED])
def test_safe_extract_refuses_and_writes_nothing(tmp_path: Path, body: bytes, status: int,
                                                 reason: str) -> None:
    dest = tmp_path / "out" / "bundle"
    dest.parent.mkdir()
    error = BundleTooLargeError if status == 413 else BundleRejectedError
    with pytest.raises(error) as refused:
        safe_extract(io.BytesIO(body), dest, max_bytes=MAX_UNPACKED, max_members=MAX_MEMBERS)
    assert reason in str(refused.value)
    assert list(dest.parent.iterdir()) == []
    assert not (tmp_path / "evil").exists()


def test_safe_extract_takes_a_good_bundle(tmp_path: Path) -> None:
    results = tmp_path / "allure-results"
    (results / "attachments").mkdir(parents=True)
    (results / "1-result.json").write_bytes(RESULT)
    (results / "attachments" / "log.txt").write_text("hello")
    run_json = tmp_path / "run.json"
    run_json.write_bytes(RUN_JSON)
    bundle = make_bundle(run_json, results, tmp_path / "b.tar.gz")
    dest = tmp_path / "unpacked"
    got = safe_extract(bundle, dest, max_bytes=MAX_UNPACKED, max_members=MAX_MEMBERS)
    assert got.run == make_run("crafted")
    assert got.files == 3
    assert (dest / "allure-results" / "attachments" / "log.txt").read_text() == "hello"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "allure-results", "b.tar.gz", "run.json", "unpacked"]


def test_make_bundle_refuses_a_symlink_in_the_results(tmp_path: Path) -> None:
    results = tmp_path / "allure-results"
    results.mkdir()
    (results / "link").symlink_to("/etc/passwd")
    run_json = tmp_path / "run.json"
    run_json.write_bytes(RUN_JSON)
    with pytest.raises(BundleRejectedError, match="not a regular file"):
        make_bundle(run_json, results, tmp_path / "b.tar.gz")


# -- header bombs, limits on headers, the gzip trailer ------------------------------

def gzip_of(parts: Iterable[bytes]) -> bytes:
    """gzip of the concatenated ``parts``, without holding them all at once."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    return b"".join([*(packer.compress(part) for part in parts), packer.flush()])


def repeated(byte: bytes, size: int) -> Iterator[bytes]:
    chunk = byte * MIB
    for _ in range(size // MIB):
        yield chunk
    yield byte * (size % MIB)


@functools.cache
def long_name_bomb() -> bytes:
    """A GNU long name of 200 MiB before a member: about 200 KB to upload."""
    size = 200 * MIB
    return gzip_of([records(GOOD), header("././@LongLink", tarfile.GNUTYPE_LONGNAME, size),
                    *repeated(b"a", size), header("allure-results/x", tarfile.REGTYPE, 0),
                    END])


@functools.cache
def pax_bomb() -> bytes:
    """A pax extended header of 100 MiB (one comment) before a member."""
    size = 100 * MIB
    start = f"{size} comment=".encode()
    return gzip_of([records(GOOD), header("././@PaxHeader", tarfile.XHDTYPE, size), start,
                    *repeated(b"c", size - len(start) - 1), b"\n",
                    header("allure-results/x", tarfile.REGTYPE, 0), END])


BOMBS = [pytest.param(long_name_bomb, "GNU long-name record", id="long-name-200MiB"),
         pytest.param(pax_bomb, "pax extended header", id="pax-100MiB")]


@pytest.mark.parametrize(("bomb", "reason"), BOMBS)
def test_header_bomb_is_refused_before_it_is_read(tmp_path: Path, bomb: Callable[[], bytes],
                                                  reason: str) -> None:
    body = bomb()
    assert len(body) < 300_000  # small enough for any upload limit
    dest = tmp_path / "out" / "bundle"
    dest.parent.mkdir()
    tracemalloc.start()
    started = time.monotonic()
    try:
        # The service's default limits: only the header caps stand in the way.
        with pytest.raises(BundleTooLargeError, match=reason) as refused:
            safe_extract(io.BytesIO(body), dest, max_bytes=DEFAULT_MAX_UNPACKED_BYTES,
                         max_members=DEFAULT_MAX_MEMBERS)
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB, f"refusing took {peak / MIB:.0f} MiB"
    assert elapsed < 5
    assert len(str(refused.value).encode()) < 1024
    assert list(dest.parent.iterdir()) == []


@pytest.mark.parametrize("length", [1024, 3000])
@pytest.mark.parametrize("format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_long_names_under_the_limit_are_taken(tmp_path: Path, length: int,
                                              format: int) -> None:
    name = name_of(length)
    body = tarball([*GOOD, _file(name, b"long")], format=format)
    got = safe_extract(io.BytesIO(body), tmp_path / "b", max_bytes=MAX_UNPACKED,
                       max_members=MAX_MEMBERS)
    assert got.files == 3
    assert (tmp_path / "b" / name).read_bytes() == b"long"


@pytest.mark.parametrize("format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_a_name_at_the_limit_too_long_for_the_data_folder_is_refused_clearly(
        tmp_path: Path, format: int) -> None:
    # 4095 bytes pass the name cap, but under any folder they make a path past PATH_MAX.
    body = tarball([*GOOD, _file(name_of(4095), b"long")], format=format)
    dest = tmp_path / "out" / "b"
    dest.parent.mkdir()
    with pytest.raises(BundleRejectedError, match="longer than the service's filesystem"):
        safe_extract(io.BytesIO(body), dest, max_bytes=MAX_UNPACKED, max_members=MAX_MEMBERS)
    assert list(dest.parent.iterdir()) == []


def test_long_name_refusal_is_short_and_says_the_length(tmp_path: Path) -> None:
    # A pax path may carry a 60,000-character name; it is refused by its length and
    # quoted cut short.
    name = name_of(60_000)
    body = tarball([*GOOD, with_pax("x", {"path": name})], format=tarfile.PAX_FORMAT)
    with pytest.raises(BundleTooLargeError) as refused:
        safe_extract(io.BytesIO(body), tmp_path / "b", max_bytes=MAX_UNPACKED,
                     max_members=MAX_MEMBERS)
    message = str(refused.value)
    assert len(message) < 600
    assert f"{name[:100]}" in message
    assert "… (60000 characters)" in message


def test_refusal_messages_are_bounded_whoever_builds_them() -> None:
    message = str(BundleRejectedError("run.json says " + "\x00\n" * 1_000_000))
    assert len(message.encode()) < 1600
    assert "\n" not in message
    assert "\x00" not in message
    assert message.endswith("(message shortened)")
    assert str(BundleRejectedError("short and plain")) == "short and plain"


@pytest.mark.parametrize("format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_header_bytes_count_toward_the_unpacked_limit(tmp_path: Path, format: int) -> None:
    # Twelve members of 1 byte each, with about 3 KiB of header each (a long name in GNU
    # format, a pax comment in pax format): far more header than data.
    members = [*GOOD, *(with_pax(name_of(2900) + str(i),
                                 {"comment": "c" * 3000} if format == tarfile.PAX_FORMAT
                                 else {}, b"x") for i in range(12))]
    data = sum(len(data) for _, data in members)
    body = tarball(members, format=format)
    assert data < 16 * 1024
    with pytest.raises(BundleTooLargeError, match="file data and tar headers"):
        safe_extract(io.BytesIO(body), tmp_path / "small", max_bytes=32 * 1024,
                     max_members=MAX_MEMBERS)
    got = safe_extract(io.BytesIO(body), tmp_path / "big", max_bytes=MAX_UNPACKED,
                       max_members=MAX_MEMBERS)
    assert got.files == 14
    assert got.total_bytes == data


def test_data_limit_still_counts_file_data(tmp_path: Path) -> None:
    # Exactly at the limit with its headers: taken; one byte more: refused.
    raw = tarball(GOOD, compress=False)
    data = len(RUN_JSON) + len(RESULT)
    headers = 3 * tarfile.BLOCKSIZE
    assert raw.count(b"ustar") == 3  # one header block per member, no extensions
    safe_extract(io.BytesIO(gzip.compress(raw)), tmp_path / "at", max_bytes=data + headers,
                 max_members=MAX_MEMBERS)
    with pytest.raises(BundleTooLargeError, match="past"):
        safe_extract(io.BytesIO(gzip.compress(raw)), tmp_path / "over",
                     max_bytes=data + headers - 1, max_members=MAX_MEMBERS)


@pytest.mark.parametrize("body", [
    pytest.param(gzip.compress(tarball(GOOD, compress=False)[:1536])
                 + gzip.compress(tarball(GOOD, compress=False)[1536:]), id="two-gzip-members"),
    pytest.param(GOOD_GZ + bytes(64), id="zero-padding-after-gzip"),
    pytest.param(gzip.compress(records(GOOD)), id="no-end-marker"),
])
def test_gzip_streams_that_are_whole_are_taken(tmp_path: Path, body: bytes) -> None:
    # Decided: a multi-member gzip is one stream (RFC 1952; gzip -d reads it so) and
    # zero padding after it is ignored, as gzip does; bytes that are not gzip after
    # it, or data after the tar end marker, are refused (see REFUSED).
    got = safe_extract(io.BytesIO(body), tmp_path / "b", max_bytes=MAX_UNPACKED,
                       max_members=MAX_MEMBERS)
    assert got.run == make_run("crafted")


def test_tarfile_still_has_what_bundle_relies_on() -> None:
    """tar_header_caps.py overrides private TarInfo hooks to cap headers before tarfile
    reads them.

    If a Python upgrade renames them, this fails first; the REFUSED cases
    long-name-4096, pax-header-over-64k, gnu-sparse and pax-sparse-* fail too, since
    their reasons come from the hooks, and so do the header bombs.
    """
    for hook in ("_proc_member", "_proc_gnulong", "_proc_pax", "_proc_sparse",
                 "_proc_gnusparse_00", "_proc_gnusparse_01", "_proc_gnusparse_10"):
        assert callable(getattr(tarfile.TarInfo, hook, None)), hook
    for error in ("InvalidHeaderError", "TruncatedHeaderError"):
        assert issubclass(getattr(tarfile, error), tarfile.HeaderError), error
    assert callable(tarfile.data_filter)


def test_every_member_goes_through_the_data_filter(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    real = tarfile.data_filter

    def spy(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo:
        seen.append((member.name, dest_path))
        return real(member, dest_path)

    monkeypatch.setattr(tarfile, "data_filter", spy)
    dest = tmp_path / "b"
    safe_extract(io.BytesIO(GOOD_GZ), dest, max_bytes=MAX_UNPACKED, max_members=MAX_MEMBERS)
    assert [name for name, _ in seen] == ["run.json", "allure-results",
                                          "allure-results/1-result.json"]
    # Into the staging folder, which is then renamed to dest.
    assert {Path(path).parent for _, path in seen} == {tmp_path}
    assert all(Path(path).name.startswith(".b.") for _, path in seen)


def test_a_data_filter_refusal_is_a_refusal_naming_the_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Our own checks refuse first whatever the filter would; to see its refusal
    # handled, the filter refuses a member our checks take.
    def refuse(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo:
        if member.name.endswith("1-result.json"):
            raise tarfile.OutsideDestinationError(member, "/elsewhere")
        return member

    monkeypatch.setattr(tarfile, "data_filter", refuse)
    dest = tmp_path / "out" / "b"
    dest.parent.mkdir()
    with pytest.raises(BundleRejectedError) as refused:
        safe_extract(io.BytesIO(GOOD_GZ), dest, max_bytes=MAX_UNPACKED,
                     max_members=MAX_MEMBERS)
    assert ("'allure-results/1-result.json' is refused by the tar data filter"
            in str(refused.value))
    assert list(dest.parent.iterdir()) == []


def test_extracted_modes_are_ours_whatever_the_archive_says(tmp_path: Path) -> None:
    run_info, run_data = _file("run.json", RUN_JSON)
    run_info.mode = 0o6777  # setuid, setgid, world-writable, executable
    folder, _ = _dir("allure-results")
    folder.mode = 0o777
    result, result_data = _file("allure-results/1-result.json", RESULT)
    result.mode = 0o4755
    body = tarball([(run_info, run_data), (folder, b""), (result, result_data)])
    dest = tmp_path / "b"
    safe_extract(io.BytesIO(body), dest, max_bytes=MAX_UNPACKED, max_members=MAX_MEMBERS)
    for path in (dest / "run.json", dest / "allure-results" / "1-result.json"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o7133 == 0, path
    assert stat.S_IMODE((dest / "allure-results").stat().st_mode) & 0o7022 == 0


# -- through the service -----------------------------------------------------------

@dataclass
class Live:
    url: str
    data_dir: Path
    store_url: str
    app: Starlette

    def post(self, body: bytes | Iterator[bytes],
             headers: dict[str, str] = HEADERS) -> httpx.Response:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            return client.post("/api/runs", content=body, headers=headers)

    def wait_for_reports(self) -> None:
        # Reports are made in tmp/ by a worker thread; wait before looking there.
        assert self.app.state.service.reports.wait_idle(60), "reports did not finish"

    def assert_nothing_written(self) -> None:
        assert list((self.data_dir / "runs").iterdir()) == []
        assert tmp_leftovers(self.data_dir) == []
        assert not list((self.data_dir / "history").iterdir())
        with open_store(self.store_url) as store:
            assert store.list_runs() == []


def _no_reports(results_dir: Path, output_dir: Path, *, history_path: Path,
                report_name: str) -> list[str]:
    raise AssertionError("a refused upload must not queue a report")


@pytest.fixture
def live(tmp_path: Path, store_url: str) -> Iterator[Live]:  # noqa: F811
    data_dir = tmp_path / "data"
    app = create_app(ServiceSettings(
        data_dir=data_dir, token=TOKEN, results_url=store_url, max_upload_bytes=MAX_UPLOAD,
        max_unpacked_bytes=MAX_UNPACKED, max_members=MAX_MEMBERS,
        report_generator=_no_reports))
    with serve_in_thread(app) as url:
        yield Live(url, data_dir, store_url, app)


@pytest.mark.parametrize(("body", "status", "reason"),
                         [pytest.param(b, s, r, id=i) for i, b, s, r in REFUSED])
def test_service_refuses_and_writes_nothing(live: Live, body: bytes, status: int,
                                            reason: str) -> None:
    answer = live.post(body)
    assert answer.status_code == status, answer.text
    assert reason in answer.json()["error"]
    live.assert_nothing_written()


def test_body_over_the_limit_by_content_length(live: Live) -> None:
    answer = live.post(os.urandom(4 * MAX_UPLOAD))
    assert answer.status_code == 413
    assert str(MAX_UPLOAD) in answer.json()["error"]
    live.assert_nothing_written()


def test_chunked_body_over_the_limit(live: Live) -> None:
    def chunks() -> Iterator[bytes]:
        # No Content-Length: only counting the streamed bytes can stop this one.
        for _ in range(4 * MAX_UPLOAD // 4096):
            yield os.urandom(4096)

    answer = live.post(chunks())
    assert answer.status_code == 413
    assert "more than" in answer.json()["error"]
    live.assert_nothing_written()


def test_good_bundle_after_refusals_is_stored(live: Live) -> None:
    assert live.post(tarball([*GOOD, _file("/abs", b"x")])).status_code == 422
    answer = live.post(tarball(GOOD))
    assert answer.status_code == 201, answer.text
    assert (live.data_dir / "runs" / "crafted" / "allure-results" / "1-result.json"
            ).read_bytes() == RESULT
    live.wait_for_reports()
    assert tmp_leftovers(live.data_dir) == []


@pytest.fixture
def live_defaults(tmp_path: Path, store_url: str) -> Iterator[Live]:  # noqa: F811
    """A service with the default limits: the header bombs fit its upload limit."""
    data_dir = tmp_path / "data"
    app = create_app(ServiceSettings(data_dir=data_dir, token=TOKEN, results_url=store_url,
                                     report_generator=no_report))
    with serve_in_thread(app) as url:
        yield Live(url, data_dir, store_url, app)


def test_service_refuses_header_bombs_and_keeps_serving(live_defaults: Live) -> None:
    for bomb, reason in ((long_name_bomb(), "GNU long-name record"),
                         (pax_bomb(), "pax extended header")):
        started = time.monotonic()
        answer = live_defaults.post(bomb)
        assert answer.status_code == 413, answer.text[:500]
        assert len(answer.content) < 4096
        assert reason in answer.json()["error"]
        assert time.monotonic() - started < 10
    live_defaults.assert_nothing_written()
    answer = live_defaults.post(GOOD_GZ)
    assert answer.status_code == 201, answer.text
    listed = httpx.get(f"{live_defaults.url}/api/runs", timeout=30)
    assert listed.status_code == 200
    assert [run["run_id"] for run in listed.json()["runs"]] == ["crafted"]
