"""The device check: its bundle, its result archive, and a dry run of the whole script.

The dry run is the device check itself on this machine's CPU build: the bundle is made
with the CPU RPC build's binary and RPC server and wheels for this Python, and
``ci/scripts/device-check.sh --dry-run`` runs under the system Python with a bare
environment — nothing of this virtual environment on its path except numpy (the GPU
machine has numpy and nothing else the harness needs) — so a wheel missing from the
bundle, a step that needs a registry or the harness installed, or an archive over the
size that can come back fails here first; and the multi-device suite runs on the carried
RPC server, as it does beside the GPU.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from checkout import REPO_ROOT

from harness.builds.resolve import ensure_build
from harness.device_check import (
    CARRY_LIMIT,
    NOT_CARRIED,
    RETURN_FILE_LIMIT,
    carried_distributions,
    pack_results,
    unpack_wheels,
)
from harness.errors import ConfigError
from harness.planning.build_plan import SUITE_BUILD

SCRIPTS = REPO_ROOT / "ci" / "scripts"


def test_every_imported_distribution_but_numpy_is_carried_at_its_pin() -> None:
    carried = {spec.name.lower(): spec.version for spec in carried_distributions()}
    assert not {name.lower() for name in NOT_CARRIED} & carried.keys()
    # The run's own plugins and what they need only later (httpx's httpcore, xdist's
    # execnet) travel too.
    # (Not SQLAlchemy: only the results store imports it, and the run never does; it was
    # carried only when an earlier test in the same worker had loaded the store.)
    for name in ("pytest", "pytest-xdist", "execnet", "allure-pytest", "gguf", "httpcore",
                 "nvidia-ml-py"):
        assert name in carried, f"{name} is not carried"
    assert carried["pytest"] == __import__("pytest").__version__


def _logs(work: Path, sizes: list[int]) -> None:
    (work / "allure-results").mkdir(parents=True)
    (work / "allure-results" / "a-result.json").write_text("{}")
    (work / "run.json").write_text('{"run_id": "x"}')
    for index, size in enumerate(sizes):
        log = work / "tmp" / f"popen-gw0/test{index}0" / f"llama-server-1-{index}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # Random bytes do not compress, so each log costs its size in the archive.
        log.write_bytes(os.urandom(size))


def test_results_keep_the_record_and_drop_the_largest_logs_to_fit(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _logs(work, [1000, 60_000, 5000])
    packed = pack_results(work, tmp_path / "out.tar.xz", limit=20_000)
    assert packed.archive.stat().st_size <= 20_000
    assert "run.json" in packed.included
    assert "allure-results" in packed.included
    assert [Path(p).name for p in packed.left_out] == ["llama-server-1-1.log"]
    with tarfile.open(packed.archive) as tar:
        names = tar.getnames()
        note = tar.extractfile("left-out.txt")
        assert note is not None
        assert "llama-server-1-1.log" in note.read().decode()
    assert any(n.endswith("llama-server-1-2.log") for n in names)


def test_results_too_large_without_logs_are_an_error(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _logs(work, [])
    (work / "allure-results" / "big.bin").write_bytes(os.urandom(50_000))
    with pytest.raises(ConfigError, match=r"even without startup logs.*select fewer tests"):
        pack_results(work, tmp_path / "out.tar.xz", limit=20_000)


def test_a_wheel_that_climbs_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "evil-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("../outside.py", "x = 1\n")
    with pytest.raises(ConfigError, match=r"evil-1.0-py3-none-any.whl holds the path"):
        unpack_wheels([wheel], tmp_path / "site")
    assert not (tmp_path / "outside.py").exists()


def _numpy_only(tmp_path: Path) -> Path:
    """A folder holding only numpy from this environment: what the GPU machine has."""
    import numpy  # noqa: PLC0415

    site = Path(numpy.__file__).parent.parent
    provided = tmp_path / "provided"
    provided.mkdir()
    for entry in site.iterdir():
        if entry.name == "numpy" or entry.name.startswith(("numpy-", "numpy.libs")):
            (provided / entry.name).symlink_to(entry)
    return provided


@pytest.mark.server
def test_the_device_check_dry_run_packs_results_that_can_come_back(
        tmp_path: Path, harness_cache: Path) -> None:
    # The suites' build (the CPU build with the RPC backend), as the real check packs
    # its CUDA build with the RPC backend: the pack finds the RPC server beside the
    # binary, and the unpacked bare binary's probe finds it beside itself again.
    build = ensure_build(harness_cache, SUITE_BUILD)
    llama_server_binary = build.binary
    assert build.info.rpc_server is not None, build.info.key
    rpc_server = Path(build.info.rpc_server)
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python3 in /usr/bin to run the dry run outside the venv")
    version = subprocess.run(
        [system_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True).stdout.strip()
    bundle = tmp_path / "bundle"
    pack = subprocess.run(["bash", str(SCRIPTS / "device-pack.sh"), "--binary",
                           str(llama_server_binary), "--out", str(bundle), "--python", version],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "HARNESS_PYTHON": sys.executable})
    assert pack.returncode == 0, pack.stderr
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size <= CARRY_LIMIT
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert lzma.decompress((bundle / "llama-server.xz").read_bytes()) == \
        llama_server_binary.read_bytes()
    assert manifest["rpc_server"]["name"] == "ggml-rpc-server"
    assert lzma.decompress((bundle / "ggml-rpc-server.xz").read_bytes()) == \
        rpc_server.read_bytes()
    assert manifest["wheels"]

    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": str(_numpy_only(tmp_path)),
           "HARNESS_DEVICE_BUNDLE": str(bundle), "HARNESS_DEVICE_WORK": str(tmp_path / "work"),
           "OUT": str(out), "HARNESS_DEVICE_WORKERS": "2",
           # The dry run proves the steps, not the suites (the suites run in this test
           # command anyway): a narrow selection keeps it short. The multi-device
           # suite's ladder test is in it (its name says ladder): it proves the carried
           # RPC server is found and starts.
           "HARNESS_DEVICE_SELECT": "smoke or gpu or ladder or planned_share"}
    run = subprocess.run(["bash", str(SCRIPTS / "device-check.sh"), "--dry-run"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False,
                         timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    assert "unpacking the binary" in log
    assert "RPC server: " in log, log[-4000:]
    archive = out / "device-check.tar.xz"
    assert archive.stat().st_size <= RETURN_FILE_LIMIT
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        record = tar.extractfile("run.json")
        assert record is not None
        outcomes = json.loads(record.read())["outcomes"]
    assert any(n.startswith("allure-results/") and n.endswith("-result.json") for n in names)
    assert any(Path(n).name.startswith("llama-server-") for n in names), names
    assert outcomes, "the run record holds no test outcome"
    # Without --harness-require-gpu the GPU-marked tests skip here; they are in the run.
    assert any("gpu" in o["test_id"] for o in outcomes)
    # The multi-device suite ran on the carried RPC server and passed; what skipped there
    # needs a GPU, none skipped for want of the RPC server (the bare binary's record).
    multi_device = [o for o in outcomes
                    if o["test_id"].startswith("suites/test_multi_device.py::")]
    ran = {o["test_id"]: o["outcome"] for o in multi_device if o["outcome"] != "skipped"}
    assert ran, [(o["test_id"], o.get("message")) for o in multi_device]
    assert set(ran.values()) == {"passed"}, ran
    assert not [o for o in multi_device if "no RPC backend" in (o.get("message") or "")]
