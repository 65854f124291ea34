"""The run record on disk: who ran what where, written once at the end of a session.

Every worker appends its figures to its own JSON-lines file beside ``run.json`` (no
locking between processes); the controller merges them with the test outcomes it saw.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import uuid
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.facts.build import BuildInfo
from harness.facts.release import Release
from harness.files import write_json_atomic
from harness.results.run_record import BuildRef, Figure, FigureKey, Hardware, RunRecord, TestOutcome


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_run_id(environ: Mapping[str, str] = os.environ) -> str:
    """``HARNESS_RUN_ID`` or a sortable, unique id (UTC time + random suffix)."""
    given = environ.get("HARNESS_RUN_ID")
    if given:
        return given
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{uuid.uuid4().hex[:8]}"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def current_branch(environ: Mapping[str, str] = os.environ) -> str:
    """``HARNESS_BRANCH``, else the CI's branch, else the checkout's, else ``local``."""
    for name in ("HARNESS_BRANCH", "GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME"):
        if environ.get(name):
            return environ[name]
    branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    return branch if branch and branch != "HEAD" else "local"


def current_commit(environ: Mapping[str, str] = os.environ) -> str:
    for name in ("HARNESS_COMMIT", "GITHUB_SHA", "CI_COMMIT_SHA"):
        if environ.get(name):
            return environ[name]
    return _git("rev-parse", "HEAD") or "unknown"


def harness_version() -> str:
    try:
        return metadata.version("harness")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_ref(info: BuildInfo | None, key: str, image_id: str | None = None) -> BuildRef:
    """The build a run tested; ``image_id`` is the engine's id of the image servers ran in."""
    if info is None:
        return BuildRef(backend="cpu", version="unknown", source_digest="unknown",
                        build_key=key, image_digest=image_id)
    return BuildRef(backend=info.backend.value, version=info.version_line,
                    source_digest=info.source_digest,
                    build_key=info.key, image_digest=image_id)


def append_figures(path: Path, figures: Iterable[Figure]) -> None:
    rows = [json.dumps({"test_id": f.test_id, "key": vars(f.key), "metric": f.metric,
                        "value": f.value, "predicted": f.predicted}) for f in figures]
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write("\n".join(rows) + "\n")


def read_figures(directory: Path) -> list[Figure]:
    """Every figure the workers wrote; a torn last line (a killed worker) is skipped."""
    found: list[Figure] = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                predicted = row.get("predicted")
                found.append(Figure(test_id=str(row["test_id"]), key=FigureKey(**row["key"]),
                                    metric=str(row["metric"]), value=float(row["value"]),
                                    predicted=float(predicted) if predicted else None))
            except (ValueError, KeyError, TypeError):
                continue
    return found


def write_run(path: Path, run: RunRecord) -> None:
    write_json_atomic(path, run.to_json())


def environment_properties(hardware: Hardware, build: BuildRef | None, image: str | None,
                           base_images: str | None = None,
                           release: Release | None = None) -> dict[str, str]:
    """What Allure's Environment widget shows: the build, the GPU, the host, the harness.

    ``build`` None: the session never touched a build (unit tests only), so none is named.
    ``release``: the build's llama.cpp release (``BuildInfo.release``), where it is known.
    """
    props = {} if build is None else {
        "build.backend": build.backend,
        "build.llama_cpp_version": build.version,
        **({"build.release": str(release)} if release is not None else {}),
        "build.source_digest": build.source_digest,
        "build.key": build.build_key,
    }
    props.update({
        "gpu.name": hardware.gpu,
        "gpu.driver": hardware.gpu_driver or "n/a",
        "gpu.vram_mib": str(hardware.vram_mib) if hardware.vram_mib is not None else "n/a",
        "host": hardware.host,
        "host.cpu": hardware.cpu,
        "harness.version": harness_version(),
        "harness.commit": _git("rev-parse", "--short", "HEAD") or "unknown",
    })
    if image:
        props["build.image"] = image
    if build is not None and build.image_digest:
        props["build.image_digest"] = build.image_digest
    if base_images:
        props["build.base_image_ids"] = base_images
    return props


def run_record(*, run_id: str, started_at: str, hardware: Hardware, build: BuildRef,
               outcomes: Iterable[TestOutcome], figures: Iterable[Figure],
               labels: Mapping[str, str] | None = None,
               numerics: Mapping[str, dict[str, Any]] | None = None) -> RunRecord:
    return RunRecord(run_id=run_id, branch=current_branch(), commit=current_commit(),
                     started_at=started_at, finished_at=now_iso(), hardware=hardware,
                     build=build, harness_version=harness_version(),
                     outcomes=tuple(outcomes), figures=tuple(figures),
                     labels=dict(labels or {}), numerics=dict(numerics) if numerics else None)
