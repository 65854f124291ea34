"""What a real ``harness serve`` spends refusing hostile uploads (issue 12).

    .venv/bin/python benchmarks/service_bombs.py [--idle-timeout-s 30]

Starts ``.venv/bin/harness serve`` on a free loopback port with a fresh data folder and
SQLite store, then runs each case of CASES against it and prints one line per case with
its figures and PASS/FAIL against the targets. Exit status 1 when a target is missed.

A case is a function from the running service to a Measurement: the two header bombs,
and 40 uploads that stop sending after their first kilobyte (how long the service holds
each before its idle timeout drops it, and whether their temp files are gone after).
Memory is the peak resident set while the case runs, above the idle figure read just
before it: the service's VmHWM (reset through /proc/PID/clear_refs before each case)
or, when higher, the sum over the service and its children sampled every 10 ms with
psutil.

The bombs are tarballs whose first header declares a huge GNU long name or pax header
made of one repeated byte, so they are a few hundred KB to send; nothing after the
header matters, since the service must stop at the header.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from harness.service.settings import DEFAULT_IDLE_TIMEOUT_S

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / ".venv" / "bin" / "harness"
TOKEN = "bench-bombs-" + "t" * 32
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/gzip"}
MIB = 1 << 20
START_DEADLINE_S = 60.0
SAMPLE_S = 0.01

#: The targets every upload case is held to.
MAX_PEAK_MIB = 100
MAX_BODY_BYTES = 4096


@dataclass
class Measurement:
    #: Figure name -> value as printed, in order.
    figures: dict[str, str]
    #: Target as printed -> met.
    targets: dict[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(self.targets.values())


@dataclass
class Service:
    """A running ``harness serve`` child."""

    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    idle_timeout_s: float

    def rss(self) -> int:
        """Resident bytes of the service and all its children now."""
        try:
            main = psutil.Process(self.proc.pid)
            procs = [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                continue  # a child that ended between listing and reading
        return total

    def reset_peak(self) -> bool:
        """Reset the service's VmHWM to its current RSS (Linux 4.0+); False if refused."""
        try:
            Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def hwm(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0


@contextmanager
def peak_rss(service: Service) -> Iterator[dict[str, int]]:
    """Yields a dict that holds ``idle`` now and ``peak`` once the block is done."""
    figures = {"idle": service.rss(), "peak": 0}
    hwm_ok = service.reset_peak()
    done = threading.Event()
    sampled = [figures["idle"]]

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            sampled.append(service.rss())

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    try:
        yield figures
    finally:
        done.set()
        sampler.join()
        figures["peak"] = max(*sampled, service.hwm() if hwm_ok else 0)


# -- the bombs ---------------------------------------------------------------------------

END = bytes(2 * tarfile.BLOCKSIZE)


def header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    return info.tobuf(tarfile.GNU_FORMAT)


def gzip_of(parts: Iterable[bytes]) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    return b"".join([*(packer.compress(part) for part in parts), packer.flush()])


def repeated(byte: bytes, size: int) -> Iterator[bytes]:
    chunk = byte * MIB
    for _ in range(size // MIB):
        yield chunk
    yield byte * (size % MIB)


def long_name_bomb(size: int = 200 * MIB) -> bytes:
    return gzip_of([header("././@LongLink", tarfile.GNUTYPE_LONGNAME, size),
                    *repeated(b"a", size), header("allure-results/x", tarfile.REGTYPE, 0),
                    END])


def pax_bomb(size: int = 100 * MIB) -> bytes:
    start = f"{size} comment=".encode()
    return gzip_of([header("././@PaxHeader", tarfile.XHDTYPE, size), start,
                    *repeated(b"c", size - len(start) - 1), b"\n",
                    header("allure-results/x", tarfile.REGTYPE, 0), END])


# -- cases --------------------------------------------------------------------------------

def upload_case(build: Callable[[], bytes]) -> Callable[[Service], Measurement]:
    """A case that posts the bundle ``build`` makes and holds it to the targets."""

    def run(service: Service) -> Measurement:
        body = build()
        with httpx.Client(base_url=service.url, timeout=300) as client, \
                peak_rss(service) as rss:
            started = time.monotonic()
            answer = client.post("/api/runs", content=body, headers=HEADERS)
            elapsed = time.monotonic() - started
        above = (rss["peak"] - rss["idle"]) / MIB
        return Measurement(
            figures={"upload": f"{len(body) / 1024:.0f} KiB",
                     "status": str(answer.status_code),
                     "error body": f"{len(answer.content)} B",
                     "peak RSS above idle": f"{above:.1f} MiB",
                     "answered in": f"{elapsed * 1000:.0f} ms"},
            targets={"refused (413/422)": answer.status_code in (413, 422),
                     f"body < {MAX_BODY_BYTES} B": len(answer.content) < MAX_BODY_BYTES,
                     f"peak < {MAX_PEAK_MIB} MiB above idle": above < MAX_PEAK_MIB})

    return run


STALLED_UPLOADS = 40
#: How much later than the idle timeout a stalled upload may be dropped.
DROP_SLACK_S = 2.0


def stalled_uploads(service: Service) -> Measurement:
    """40 authenticated uploads that stop after 1 KiB: how long is each held?"""
    host, port = service.url.removeprefix("http://").split(":")
    head = (b"POST /api/runs HTTP/1.1\r\nHost: bench\r\nContent-Type: application/gzip\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {MIB}\r\n\r\n".encode())
    sockets = []
    for _ in range(STALLED_UPLOADS):
        sock = socket.create_connection((host, int(port)), timeout=30)
        sock.sendall(head + b"\x1f\x8b" + bytes(1022))
        sockets.append(sock)
    started = time.monotonic()
    held: list[float] = []
    answers: list[bytes] = []
    limit = service.idle_timeout_s * 3 + 30
    for sock in sockets:
        sock.settimeout(limit)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            received = b"(still open)"
        held.append(time.monotonic() - started)
        answers.append(received[:12])
        sock.close()
    time.sleep(0.5)
    left = list((service.data_dir / "tmp").glob("upload-*"))
    longest = max(held)
    return Measurement(
        figures={"stalled uploads": str(STALLED_UPLOADS),
                 "idle timeout": f"{service.idle_timeout_s:g} s",
                 "held (longest)": f"{longest:.1f} s",
                 "answered 408": f"{sum(a.startswith(b'HTTP/1.1 408') for a in answers)}",
                 "temp files left": str(len(left))},
        targets={f"dropped within idle + {DROP_SLACK_S:g} s":
                 longest <= service.idle_timeout_s + DROP_SLACK_S,
                 "no temp file left": not left})


CASES: list[tuple[str, Callable[[Service], Measurement]]] = [
    ("GNU long name of 200 MiB", upload_case(long_name_bomb)),
    ("pax header of 100 MiB", upload_case(pax_bomb)),
    ("uploads that stop sending", stalled_uploads),
]


# -- the service --------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_service(workdir: Path, idle_timeout_s: float) -> Iterator[Service]:
    port = free_port()
    argv = [str(HARNESS), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--data-dir", str(workdir / "data"),
            "--results-url", f"sqlite:///{workdir / 'results.sqlite'}",
            "--idle-timeout-s", str(idle_timeout_s)]
    log_path = workdir / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env={**os.environ, "HARNESS_SERVICE_TOKEN": TOKEN},
                                stdout=log, stderr=subprocess.STDOUT)
    service = Service(f"http://127.0.0.1:{port}", proc, workdir / "data", idle_timeout_s)
    try:
        wait_healthy(service, log_path)
        yield service
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def wait_healthy(service: Service, log_path: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        if service.proc.poll() is not None:
            raise SystemExit(f"harness serve exited {service.proc.returncode}:\n"
                             f"{log_path.read_text(errors='replace')}")
        try:
            if httpx.get(f"{service.url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"harness serve did not answer /healthz within "
                             f"{START_DEADLINE_S:.0f}s; its log: {log_path}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-timeout-s", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                        help="the service's idle timeout (default: the service's default)")
    args = parser.parse_args()
    if not HARNESS.exists():
        print(f"{HARNESS} is missing; create the venv first (scripts/setup.sh)",
              file=sys.stderr)
        return 2
    print("service_bombs: a real `harness serve` refusing tar-header bombs (status, error "
          "body size, peak RSS above idle of service and children, time to answer) and "
          "dropping uploads that stop sending (how long each is held)")
    print(f"targets: refused with 413/422, error body under {MAX_BODY_BYTES} B, peak RSS "
          f"under {MAX_PEAK_MIB} MiB above idle")
    missed = []
    with tempfile.TemporaryDirectory(prefix="bench-bombs-") as tmp, \
            running_service(Path(tmp), args.idle_timeout_s) as service:
        # One request first, so the idle figure is that of a service that has answered.
        httpx.get(f"{service.url}/api/runs", timeout=30).raise_for_status()
        print(f"service idle RSS: {service.rss() / MIB:.1f} MiB")
        for name, case in CASES:
            measured = case(service)
            figures = ", ".join(f"{key} {value}" for key, value in measured.figures.items())
            verdicts = ", ".join(f"{target}: {'PASS' if met else 'FAIL'}"
                                 for target, met in measured.targets.items())
            print(f"{'PASS' if measured.passed else 'FAIL'}  {name}: {figures}  [{verdicts}]")
            if not measured.passed:
                missed.append(name)
    if missed:
        print(f"targets missed: {', '.join(missed)}")
        return 1
    print("all targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
