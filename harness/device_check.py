"""The device check's two ends: what travels to a GPU machine, and what comes back.

A lent GPU machine (docs/design.md: one H200, no Docker, no package registry, 64 MiB carried
per call, at most 8 files of 16 MiB back) runs ``ci/scripts/device-check.sh``. This
module makes the bundle it needs — the llama-server binary compressed (and the RPC
server, when one is carried: the multi-device suite's extra devices), and wheels for
every distribution the plugin imports except numpy, which that machine has — and packs
the results (run record, Allure results, startup logs) into one archive under the size
that can come back. ``python -m harness.device_check bundle|results …`` is how the
scripts call it.

The wheels are unpacked straight onto ``PYTHONPATH`` there (a wheel is a zip of an
installed tree), so no pip and no virtual environment are needed, and the carried
pytest and plugins shadow whatever versions the machine has.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from harness.errors import ConfigError
from harness.resources.python_pins import normal_name, read_constraints

MIB = 1024 * 1024
#: What may travel with one call of the device tool, and what one returned file may be.
CARRY_LIMIT = 64 * MIB
RETURN_FILE_LIMIT = 16 * MIB
#: The modules a device-check run imports: the plugin and its recording half, the CLI
#: (fixtures), and the pytest plugins the run uses.
ENTRY_MODULES = ("harness.plugin.hooks", "harness.plugin.recording.pytest_plugin",
                 "harness.commands",
                 "harness.modelgen", "allure_pytest.plugin", "pytest_timeout", "xdist",
                 "xdist.plugin")
#: Distributions not carried: the harness itself travels as the checkout, numpy is on
#: the GPU machine (16 MB a wheel), setuptools is only imported by accident of packaging.
NOT_CARRIED = frozenset({"harness", "numpy", "setuptools"})
BINARY_NAME = "llama-server"
#: The RPC server's name in the bundle (``.xz``) and beside the unpacked binary, where a
#: bare binary's probe looks for it (harness/builds/under_test.py).
RPC_SERVER_NAME = "ggml-rpc-server"


@dataclass(frozen=True)
class WheelSpec:
    """One distribution to carry, pinned."""

    name: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def carried_distributions(constraints: dict[str, str] | None = None) -> list[WheelSpec]:
    """The distributions the device-check run imports, each at the pinned version.

    Found by importing :data:`ENTRY_MODULES`, mapping every loaded top-level module to
    its distribution, and adding what those require (a module imported only later, such
    as httpx's httpcore, is still carried), so a new dependency travels without anyone
    listing it.
    """
    for module in ENTRY_MODULES:
        importlib.import_module(module)
    owners = metadata.packages_distributions()
    loaded = {dist for module in list(sys.modules) for dist in owners.get(module.split(".")[0], ())}
    names = _with_requirements(loaded - NOT_CARRIED)
    pins = constraints if constraints is not None else read_constraints()
    specs = []
    for name in sorted(names - NOT_CARRIED, key=str.lower):
        version = pins.get(normal_name(name)) or metadata.version(name)
        specs.append(WheelSpec(name, version))
    return specs


def _with_requirements(names: set[str]) -> set[str]:
    """``names`` and, transitively, every distribution they require on this platform."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - pack side only

    found = {normal_name(n): n for n in names}
    todo = list(names)
    while todo:
        for line in metadata.requires(todo.pop()) or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            key = normal_name(requirement.name)
            if key in found or key in {normal_name(n) for n in NOT_CARRIED}:
                continue
            found[key] = metadata.metadata(requirement.name)["Name"]
            todo.append(found[key])
    return set(found.values())


def download_argv(specs: Sequence[WheelSpec], dest: Path, python_version: str) -> list[str]:
    """``pip download`` of exactly these wheels for ``python_version`` on x86-64 Linux."""
    abi = "cp" + python_version.replace(".", "")
    return [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--dest", str(dest),
            "--python-version", python_version, "--implementation", "cp", "--abi", abi,
            "--abi", "abi3", "--abi", "none",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "any",
            *(spec.requirement for spec in specs)]


def make_bundle(binary: Path, out: Path, python_version: str,
                rpc_server: Path | None = None) -> dict[str, object]:
    """Write ``out/``: the binary xz-compressed with its sha256, the RPC server likewise
    when one is given (the manifest's ``rpc_server``), and the wheels.

    Refuses a bundle over :data:`CARRY_LIMIT` (with what took the space), since the
    device tool would not carry it.
    """
    if not binary.is_file():
        raise ConfigError(f"no llama-server binary at {binary}; build one "
                          "(harness build --backend cuda --cuda-arch 90) or pass --binary")
    if rpc_server is not None and not rpc_server.is_file():
        raise ConfigError(f"no RPC server at {rpc_server}; build one (harness build "
                          "--backend cpu --rpc puts it in bin/ beside llama-server) or drop "
                          "--rpc-server")
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    specs = carried_distributions()
    proc = subprocess.run(download_argv(specs, wheels, python_version), capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"pip could not fetch the device check's wheels for Python "
                          f"{python_version}:\n{proc.stderr[-2000:]}")
    manifest: dict[str, object] = {"binary": _compress(binary, out / f"{BINARY_NAME}.xz")}
    if rpc_server is not None:
        manifest["rpc_server"] = _compress(rpc_server, out / f"{RPC_SERVER_NAME}.xz")
    manifest.update({
        "python": python_version,
        "wheels": sorted(p.name for p in wheels.glob("*.whl")),
        "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    manifest["bytes"] = total
    if total > CARRY_LIMIT:
        compressed = ", ".join(
            f"{name} {(out / f'{name}.xz').stat().st_size / MIB:.1f} MiB"
            for name in (BINARY_NAME, RPC_SERVER_NAME) if (out / f"{name}.xz").is_file())
        raise ConfigError(f"the device bundle {out} is {total / MIB:.1f} MiB, over the "
                          f"{CARRY_LIMIT // MIB} MiB a call carries (compressed: "
                          f"{compressed}); build a reduced binary (--reduced) or carry "
                          "fewer wheels")
    return manifest


def _compress(source: Path, target: Path) -> dict[str, object]:
    """``source`` xz-compressed to ``target``; its manifest entry (name, sha256, sizes)."""
    data = source.read_bytes()
    target.write_bytes(lzma.compress(data, preset=6))
    return {"name": source.name, "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "compressed_bytes": target.stat().st_size}


def unpack_wheels(wheels: Iterable[Path], site: Path) -> int:
    """Unpack each wheel into ``site`` (their installed layout); returns how many."""
    site.mkdir(parents=True, exist_ok=True)
    count = 0
    for wheel in sorted(wheels):
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                # A wheel is trusted input (we made the bundle), but a path that climbs
                # out of the folder would still be written anywhere: refuse it.
                if member.startswith("/") or ".." in Path(member).parts:
                    raise ConfigError(f"{wheel.name} holds the path {member!r}")
            archive.extractall(site)
        count += 1
    return count


@dataclass(frozen=True)
class PackedResults:
    archive: Path
    included: tuple[str, ...]
    left_out: tuple[str, ...]


def pack_results(work: Path, archive: Path, limit: int = RETURN_FILE_LIMIT) -> PackedResults:
    """One ``.tar.xz`` of ``run.json``, ``allure-results/`` and the startup logs.

    The run record and the Allure results go first, then the startup logs, smallest
    first, each only while the compressed archive stays under ``limit``; what did not fit
    is listed in ``left-out.txt`` inside it, so a reader knows the archive is partial.
    """
    logs = sorted(work.rglob("llama-server-*.log"), key=lambda p: p.stat().st_size)
    wanted = [p for p in (work / "run.json", work / "allure-results",
                          work / "device-check.log") if p.exists()]

    def write(kept: int) -> bool:
        """Write the archive with the ``kept`` smallest logs; whether it fits."""
        left_out = [str(p.relative_to(work)) for p in reversed(logs[kept:])]
        _write_archive(archive, work, [*wanted, *logs[:kept]], left_out)
        return archive.stat().st_size <= limit

    # The most logs that fit, found by bisection: each try compresses everything again,
    # so dropping one log at a time would cost a try per log on a run of hundreds.
    kept = len(logs)
    if not write(kept):
        if not write(0):
            raise ConfigError(f"{archive} is {archive.stat().st_size / MIB:.1f} MiB even "
                              f"without startup logs, over {limit // MIB} MiB: select fewer "
                              "tests")
        low, high = 0, kept  # write(low) fits, write(high) does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if write(middle) else (low, middle)
        kept = low
        write(kept)
    members = [*wanted, *logs[:kept]]
    return PackedResults(archive, tuple(str(m.relative_to(work)) for m in members),
                         tuple(str(p.relative_to(work)) for p in reversed(logs[kept:])))


def _write_archive(archive: Path, work: Path, members: Sequence[Path],
                   left_out: Sequence[str]) -> None:
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for member in members:
            tar.add(member, arcname=str(member.relative_to(work)))
        if left_out:
            note = ("left out to stay under the size limit:\n" + "\n".join(left_out)
                    + "\n").encode()
            info = tarfile.TarInfo("left-out.txt")
            info.size = len(note)
            tar.addfile(info, io.BytesIO(note))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.device_check")
    commands = parser.add_subparsers(dest="command", required=True)
    bundle = commands.add_parser("bundle", help="make the bundle a device-check call carries")
    bundle.add_argument("--binary", type=Path, required=True)
    bundle.add_argument("--rpc-server", type=Path, default=None,
                        help="an RPC server to carry beside the binary (ggml-rpc-server)")
    bundle.add_argument("--out", type=Path, required=True)
    bundle.add_argument("--python", default="3.12",
                        help="the GPU machine's Python (default 3.12)")
    unpack = commands.add_parser("unpack", help="unpack the carried wheels onto a folder")
    unpack.add_argument("--wheels", type=Path, required=True)
    unpack.add_argument("--site", type=Path, required=True)
    results = commands.add_parser("results", help="pack the results into one archive")
    results.add_argument("--work", type=Path, required=True)
    results.add_argument("--archive", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "bundle":
            manifest = make_bundle(args.binary, args.out, args.python, args.rpc_server)
            print(json.dumps({k: v for k, v in manifest.items() if k != "wheels"}))
        elif args.command == "unpack":
            print(f"unpacked {unpack_wheels(args.wheels.glob('*.whl'), args.site)} wheels")
        else:
            packed = pack_results(args.work, args.archive)
            print(f"{packed.archive} {packed.archive.stat().st_size} bytes, "
                  f"{len(packed.included)} entries, {len(packed.left_out)} logs left out")
    except ConfigError as exc:
        print(f"device check: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
