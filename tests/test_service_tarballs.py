"""Hostile and broken uploads: each is refused with a 4xx and leaves nothing behind.

The tarballs are crafted here with tarfile, member by member, so each carries exactly
one thing wrong; "nothing behind" means no run folder, no temp leftovers and no row.
The first part drives ``safe_extract`` directly, the second posts to a live service.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from results_fixtures import make_run, store_url  # noqa: F401 - store_url is a fixture

from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import (
    BundleRejectedError,
    BundleTooLargeError,
    make_bundle,
    safe_extract,
)
from harness.service.settings import ServiceSettings

TOKEN = "tarball-token-" + "y" * 20
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/gzip"}
MAX_UPLOAD = 64 * 1024
MAX_UNPACKED = 256 * 1024
MAX_MEMBERS = 40

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


def tarball(members: list[tuple[tarfile.TarInfo, bytes]], *, compress: bool = True) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return gzip.compress(raw.getvalue()) if compress else raw.getvalue()


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
     422, "not a valid run record"),
    ("run-json-bad-id", tarball([
        _file("run.json", json.dumps(make_run("../../etc").to_json()).encode()),
        *GOOD[1:]]), 422, "'../../etc'"),
    ("not-gzip", tarball(GOOD, compress=False), 422, "not a readable gzip tarball"),
    ("garbage", os.urandom(2048), 422, "not a readable gzip tarball"),
    ("bomb", tarball([*GOOD, _file("allure-results/zeros", bytes(4 * MAX_UNPACKED))]), 413,
     "unpacked"),
    # Read whole by tarfile before any check could see it: only the cap on the
    # decompressed stream stops this one.
    ("huge-name-header", tarball([*GOOD, _file("allure-results/" + "a" * (4 * MAX_UNPACKED),
                                               b"x")]), 413, "unpacks to more than"),
    ("truncated", gzip.compress(tarball([*GOOD, _file("allure-results/big", bytes(8192))],
                                        compress=False)[:4096]), 422,
     "not a readable gzip tarball"),
    ("too-many-members", tarball([*GOOD, *(_file(f"allure-results/{i}.json", b"{}")
                                           for i in range(MAX_MEMBERS))]), 413, "members"),
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


# -- through the service -----------------------------------------------------------

@dataclass
class Live:
    url: str
    data_dir: Path
    store_url: str

    def post(self, body: bytes | Iterator[bytes],
             headers: dict[str, str] = HEADERS) -> httpx.Response:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            return client.post("/api/runs", content=body, headers=headers)

    def assert_nothing_written(self) -> None:
        assert list((self.data_dir / "runs").iterdir()) == []
        assert list((self.data_dir / "tmp").iterdir()) == []
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
        yield Live(url, data_dir, store_url)


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
    assert list((live.data_dir / "tmp").iterdir()) == []
