"""Every call to the results service ends, reads a bounded answer, and fails in one line.

Each hostile service is a real socket on 127.0.0.1 (``serving`` from
test_bounded_waits.py): one that accepts and never answers, one that never reads the
upload, one that sends its headers and then a byte at a time, one whose body never
ends (plain, or a small gzip that unpacks to more than the cap), one that answers 503,
and ones that answer NaN, Infinity, 1e999 or HTML. The call, then each command that
makes one (calibrate, upload, compare --service, repro, doctor, the nightly's look for
earlier nights) and the llama-server client meet them with their deadlines and caps set
low, and must end within the deadline (plus a margin for a loaded machine) with the
error that names the service, the call and what happened.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import service_helpers
from click.testing import CliRunner, Result
from results_fixtures import make_run
from test_bounded_waits import answers_a_byte_at_a_time, never_answers, read_request, serving
from test_upload_cli import run_files  # noqa: F401 - a fixture

from harness.client import ServerClient
from harness.commands import calibrate, compare
from harness.commands.calibrate import calibrate_command
from harness.commands.compare import compare_command
from harness.commands.repro import repro_command
from harness.commands.upload import upload_command
from harness.doctor import gather
from harness.errors import ServerApiError, ServiceError
from harness.http_bounds import DeadlinePassed, bounded_call_in_time
from harness.repro.fetch import fetch_failure
from harness.repro.target import ServiceTarget
from harness.service import branch_runs, upload_client
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import make_bundle
from harness.service.finite_json import NotFiniteError, loads_finite
from harness.service.service_client import ServiceCall
from harness.service.settings import TOKEN_ENV, ServiceSettings

Behaviour = Callable[[socket.socket], None]
#: Every call's deadline here; a call must end within it plus this margin.
DEADLINE_S = 1.0
MARGIN_S = 1.5
CAP = 256 * 1024


def answer(conn: socket.socket, status: str, body: bytes, *,
           content_type: str = "application/json", extra: str = "") -> None:
    conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)


def answers(status: str, body: bytes, **options: str) -> Behaviour:
    """A service that reads the request and answers it once with ``body``."""
    def behaviour(conn: socket.socket) -> None:
        read_request(conn)
        answer(conn, status, body, **options)
    return behaviour


def endless_body(conn: socket.socket) -> None:
    read_request(conn)
    send_without_end(conn)


def send_without_end(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\n\r\n[")
    chunk = b"0," * 32768
    while True:  # until the client hangs up
        conn.sendall(chunk)


def never_reads(conn: socket.socket) -> None:
    """Accepts and reads nothing: an upload fills the socket buffers and stalls."""
    time.sleep(60)


#: Small on the wire, four MiB unpacked.
GZIP_BOMB = answers("200 OK", gzip.compress(b" " * (4 << 20)), extra="Content-Encoding: gzip\r\n")
NAN_LISTING = b'{"runs": [{"run_id": "a", "median": 1.5}, {"run_id": "b", "median": NaN}]}'

HOSTILE: dict[str, tuple[Behaviour, str]] = {
    "never answers": (never_answers, "did not finish within 1s"),
    "a byte at a time": (answers_a_byte_at_a_time, "did not finish within 1s ("),
    "an endless body": (endless_body, "sent more than 256 KiB"),
    "a gzip bomb": (GZIP_BOMB, "sent more than 256 KiB"),
    "503": (answers("503 Service Unavailable", b"x" * 300 + b"NOT-QUOTED",
                    content_type="text/plain"), "answered HTTP 503: " + "x" * 300),
    "NaN": (answers("200 OK", NAN_LISTING),
            "sent a number that is not finite (NaN) at $.runs[1].median"),
    "-Infinity": (answers("200 OK", b'{"runs": [], "x": [-Infinity]}'),
                  "sent a number that is not finite (-Infinity) at $.x[0]"),
    "1e999": (answers("200 OK", b'{"runs": {"v": 1e999}}'),
              "sent a number that is not finite (1e999) at $.runs.v"),
    "HTML": (answers("200 OK", b"<html>hello</html>", content_type="text/html"),
             "sent a body that is not JSON"),
}


@contextlib.contextmanager
def ends_in_time(deadline_s: float = DEADLINE_S) -> Iterator[None]:
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    assert took < deadline_s + MARGIN_S, f"the call took {took:.1f}s"


@pytest.fixture
def low_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's deadline DEADLINE_S and answer cap CAP."""
    for module, names in ((calibrate, ("LISTING_MAX_BYTES", "RUN_MAX_BYTES")),
                          (compare, ("SERVICE_MAX_BYTES",)),
                          (upload_client, ("ANSWER_MAX_BYTES",)),
                          (branch_runs, ("MAX_BYTES",)),
                          (gather, ("HEALTHZ_MAX_BYTES",))):
        for name in names:
            monkeypatch.setattr(module, name, CAP)
    monkeypatch.setattr(calibrate, "TIMEOUT_S", DEADLINE_S)
    monkeypatch.setattr(compare, "SERVICE_TIMEOUT_S", DEADLINE_S)
    monkeypatch.setattr(branch_runs, "TIMEOUT_S", DEADLINE_S)
    monkeypatch.setattr(gather, "_TIMEOUT_S", DEADLINE_S)
    monkeypatch.setattr("harness.repro.fetch.MAX_ANSWER_BYTES", CAP)
    monkeypatch.setattr("harness.repro.fetch.DEFAULT_TIMEOUT_S", DEADLINE_S)


def one_error_line(done: Result, prefix: str) -> str:
    """The command's one line of output, which must be an error and no traceback."""
    assert isinstance(done.exception, SystemExit), done.exception
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert len(lines) == 1, done.output
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# --- the call --------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", list(HOSTILE))
def test_a_hostile_service_is_one_error_naming_service_call_and_what(hostile: str) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        call = ServiceCall(url, "GET", "/api/runs", DEADLINE_S, CAP)
        with pytest.raises(ServiceError) as raised:
            call.json_object(call.send(params={"limit": 1}))
    message = str(raised.value)
    assert message.startswith(f"the results service at {url}: GET /api/runs "), message
    assert says in message
    assert "NOT-QUOTED" not in message  # 300 characters of a reason, no more
    assert "\n" not in message


def test_the_deadline_is_for_the_whole_call_not_each_wait() -> None:
    """Bytes 0.9 s apart: no single wait reaches the deadline, so waits alone would
    let the call run to the second byte past it (1.8 s); the caller stops at 1 s."""
    def every_0_9s(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            conn.sendall(b" ")
            time.sleep(0.9)

    with serving(every_0_9s) as url, httpx.Client() as http:
        started = time.monotonic()
        with pytest.raises(DeadlinePassed, match=r"did not finish within 1s \(\d bytes"):
            bounded_call_in_time(http, "GET", url, timeout_s=1.0, max_bytes=CAP)
        assert time.monotonic() - started < 1.5


def test_an_unreachable_service_names_the_setting_to_check() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}"
    call = ServiceCall(gone, "GET", "/api/runs", DEADLINE_S, CAP, setting="--url")
    with pytest.raises(ServiceError, match=f"cannot reach the results service at {gone} "
                                           r"\(GET /api/runs\): .*; check --url") as raised:
        call.send()
    assert raised.value.what.startswith("no answer (ConnectError")


def test_a_reason_is_its_json_error_cut_short_and_printable() -> None:
    body = json.dumps({"error": "no \x1b[31mrun\x1b[0m " + "y" * 400}).encode()
    with serving(answers("404 Not Found", body)) as url, pytest.raises(ServiceError) as raised:
        ServiceCall(url, "GET", "/api/runs/x", DEADLINE_S, CAP).send()
    assert raised.value.status_code == 404
    assert raised.value.what == "answered HTTP 404: " + ("no  [31mrun [0m " + "y" * 400)[:300]


def test_finite_json_names_the_path_of_the_first_bad_number() -> None:
    assert loads_finite(b'{"a": [1, 2.5, -3e2]}') == {"a": [1, 2.5, -300.0]}
    with pytest.raises(NotFiniteError) as raised:
        loads_finite('{"a": [1, {"b c": Infinity}], "d": NaN}')
    assert raised.value.path == "$.a[1]['b c']"
    assert raised.value.literal == "Infinity"
    with pytest.raises(ValueError, match="nested too deep"):
        loads_finite("[" * 100_000 + "]" * 100_000)


# --- the commands ----------------------------------------------------------------------


def _runs_then(run_answer: bytes) -> Behaviour:
    """A service that lists one run and answers its record with ``run_answer``."""
    def behaviour(conn: socket.socket) -> None:
        head = read_request(conn)
        if head.startswith(b"GET /api/runs?"):
            answer(conn, "200 OK", b'{"runs": [{"run_id": "r1", "branch": "nightly/a"}]}')
        else:
            answer(conn, "200 OK", run_answer)
    return behaviour


def _calibrate(url: str) -> Result:
    return CliRunner().invoke(calibrate_command, ["--service", url, "--branch", "nightly/"])


@pytest.mark.parametrize("hostile", ["a byte at a time", "an endless body", "503", "NaN",
                                     "HTML"])
@pytest.mark.usefixtures("low_bounds")
def test_calibrate_against_a_hostile_service_exits_with_one_error_line(hostile: str) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        done = _calibrate(url)
    assert done.exit_code == 1
    line = one_error_line(done, f"Error: the results service at {url}: GET /api/runs ")
    assert says in line


@pytest.mark.usefixtures("low_bounds")
def test_calibrate_refuses_a_run_record_holding_nan() -> None:
    text = json.dumps({"run": make_run("r1").to_json()}).replace('"ci-1"', "NaN", 1)
    with serving(_runs_then(text.encode())) as url, ends_in_time():
        done = _calibrate(url)
    assert done.exit_code == 1
    line = one_error_line(done, f"Error: the results service at {url}: GET /api/runs/r1 ")
    assert "sent a number that is not finite (NaN) at $.run.hardware.host" in line


@pytest.mark.usefixtures("low_bounds")
def test_calibrate_stops_a_run_record_that_never_ends() -> None:
    def behaviour(conn: socket.socket) -> None:
        head = read_request(conn)
        if head.startswith(b"GET /api/runs?"):
            answer(conn, "200 OK", b'{"runs": [{"run_id": "r1", "branch": "nightly/a"}]}')
        else:
            send_without_end(conn)

    with serving(behaviour) as url, ends_in_time():
        done = _calibrate(url)
    line = one_error_line(done, f"Error: the results service at {url}: GET /api/runs/r1 ")
    assert "sent more than 256 KiB" in line


def _upload(url: str, files: tuple[Path, Path]) -> Result:
    run_json, results = files
    return CliRunner().invoke(upload_command, [
        "--url", url, "--run-json", str(run_json), "--results", str(results),
        "--timeout", f"{DEADLINE_S:g}"], env={TOKEN_ENV: "t" * 24})


@pytest.mark.parametrize("hostile", ["never answers", "a byte at a time", "an endless body",
                                     "a gzip bomb", "503", "HTML", "1e999"])
@pytest.mark.usefixtures("low_bounds")
def test_upload_to_a_hostile_service_exits_with_one_error_line(
        hostile: str, run_files: tuple[Path, Path]) -> None:  # noqa: F811
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        done = _upload(url, run_files)
    assert done.exit_code == 1
    line = one_error_line(done, f"Error: the results service at {url}: POST /api/runs ")
    assert says in line


@pytest.mark.usefixtures("low_bounds")
def test_an_upload_the_service_never_reads_ends_at_the_deadline(
        run_files: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    # Incompressible, and more than the socket buffers hold: the send itself stalls.
    (run_files[1] / "big.bin").write_bytes(os.urandom(24 << 20))
    # The command packs the bundle before its POST, and only the POST has the deadline.
    # Packing 24 MiB through gzip takes seconds on a loaded runner (2.8 s in all, against
    # 2.5 s allowed, failed a CI run with three workers on two cores), so the packing is
    # timed here and allowed twice over on top; a hang still fails.
    packing_started = time.monotonic()
    make_bundle(*run_files, tmp_path / "packing-time.tar.gz")
    packing_s = time.monotonic() - packing_started
    with serving(never_reads) as url, ends_in_time(DEADLINE_S + 2 * packing_s):
        done = _upload(url, run_files)
    assert done.exit_code == 1
    line = one_error_line(done, f"Error: the results service at {url}: POST /api/runs ")
    assert "did not finish within 1s" in line


@pytest.mark.parametrize("hostile", ["a byte at a time", "an endless body", "NaN", "HTML"])
@pytest.mark.usefixtures("low_bounds")
def test_compare_against_a_hostile_service_exits_2_with_one_error_line(hostile: str) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        done = CliRunner().invoke(compare_command, ["--service", url, "--baseline", "main",
                                                    "--current", "pr-1"])
    assert done.exit_code == 2
    line = one_error_line(done, f"error: the results service at {url}: GET /api/compare ")
    assert says in line


@pytest.mark.parametrize("hostile", ["never answers", "an endless body", "NaN"])
@pytest.mark.usefixtures("low_bounds")
def test_repro_from_a_hostile_service_is_one_service_error(hostile: str) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time(), pytest.raises(ServiceError) as raised:
        fetch_failure(ServiceTarget(service=url, run_id="r 1", test="t.py::x"),
                      timeout_s=DEADLINE_S)
    assert str(raised.value).startswith(
        f"the results service at {url}: GET /api/runs/r%201/results ")
    assert says in str(raised.value)


@pytest.mark.parametrize("hostile", ["a byte at a time", "503"])
@pytest.mark.usefixtures("low_bounds")
def test_repro_command_against_a_hostile_service_exits_2_with_one_error_line(
        hostile: str) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        done = CliRunner().invoke(repro_command, ["--run", "r1", "--test", "t.py::x",
                                                  "--service", url])
    assert done.exit_code == 2
    line = one_error_line(done, f"Error: the results service at {url}: GET "
                                "/api/runs/r1/results ")
    assert says in line


@pytest.mark.parametrize("hostile", ["never answers", "an endless body"])
@pytest.mark.usefixtures("low_bounds")
def test_doctor_reports_a_hostile_service_as_a_problem(
        hostile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        monkeypatch.setenv(gather.SERVICE_URL_ENV, url)
        facts = gather._service()
    assert facts.status is None
    assert facts.problem is not None
    assert facts.problem.startswith(says)


@pytest.mark.parametrize("hostile", ["a byte at a time", "an endless body", "NaN", "503"])
@pytest.mark.usefixtures("low_bounds")
def test_the_nightlys_look_for_earlier_nights_ends_with_one_line(
        hostile: str, capsys: pytest.CaptureFixture[str]) -> None:
    behaviour, says = HOSTILE[hostile]
    with serving(behaviour) as url, ends_in_time():
        assert branch_runs.main([url, "nightly/a/b"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"nightly: cannot list nightly/a/b runs: the results service at "
                          f"{url}: GET /api/runs ")
    assert says in err


def test_the_nightlys_look_reads_the_answer() -> None:
    with serving(answers("200 OK", b'{"runs": [{"run_id": "n1"}]}')) as url:
        assert branch_runs.main([url, "nightly/a/b"]) == 0
    with serving(answers("200 OK", b'{"runs": []}')) as url:
        assert branch_runs.main([url, "nightly/a/b"]) == 1


def test_the_llama_server_client_stops_an_endless_answer_at_its_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("harness.client.MAX_ANSWER_BYTES", CAP)
    with serving(endless_body) as url, ends_in_time(), \
            ServerClient(url, timeout_s=30) as client, \
            pytest.raises(ServerApiError, match=r"GET .*/props sent more than 256 KiB"):
        client.props()


def test_upload_and_repro_read_a_real_service(tmp_path: Path,
                                              run_files: tuple[Path, Path]) -> None:  # noqa: F811
    """The bounds leave a well-behaved service's answers as they were."""
    run_json, results = run_files
    result = {"uuid": "5b1c3a4e-0000-4000-8000-000000000001", "name": "test_x",
              "status": "failed", "stage": "finished", "start": 1, "stop": 2,
              "statusDetails": {"message": "boom"},
              "labels": [{"name": "nodeid", "value": "suites/t.py::test_x"}],
              "attachments": [{"name": "server 1 argv", "source": "argv.txt",
                               "type": "text/plain"}]}
    (results / f"{result['uuid']}-result.json").write_text(json.dumps(result))
    (results / "argv.txt").write_text("llama-server --port 0")
    (results / "environment.properties").write_text("build.backend=cpu\n")
    token = "t" * 24
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token=token,
                                     results_url=f"sqlite:///{tmp_path / 'r.sqlite'}",
                                     report_generator=service_helpers.no_report))
    with serve_in_thread(app) as url:
        bundle = make_bundle(run_json, results, tmp_path / "bundle.tar.gz")
        assert upload_client.upload_bundle(url, bundle, token).run_id == "cli-run"
        failure = fetch_failure(ServiceTarget(service=url, run_id="cli-run",
                                              test="suites/t.py::test_x"))
        assert branch_runs.has_runs(url, "main")
        assert not branch_runs.has_runs(url, "nightly/none")
    assert failure.status == "failed"
    assert failure.server_argvs == (("llama-server", "--port", "0"),)
    assert failure.properties == {"build.backend": "cpu"}
