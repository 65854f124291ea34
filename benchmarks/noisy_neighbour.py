"""A noisy neighbour for the A/B benchmarks: a real build of another tree on the same cores.

A build is what shares a CI runner with a gate: compilers on every core, bursts of
memory traffic and disk, none of it steady. The neighbour configures a fresh build
folder of the pinned llama.cpp source with the compiler cache off (so it compiles, not
copies), builds it with as many jobs as there are cores, cleans and builds again, until
stopped. It runs in its own process group and is killed with it.

    with NoisyNeighbour(source_tree, work_dir):
        ...  # measure beside it
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

#: Rebuilt again and again: configure once, then build, clean, build.
_LOOP = ('cmake -S "$1" -B "$2" -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF '
         '>/dev/null && while true; do cmake --build "$2" -j "$3" >/dev/null 2>&1; '
         'cmake --build "$2" --target clean >/dev/null 2>&1; done')


class NoisyNeighbour:
    """A build of ``tree`` looping beside the caller until the ``with`` block ends."""

    def __init__(self, tree: Path, jobs: int | None = None) -> None:
        self.tree = tree
        self.jobs = jobs or len(os.sched_getaffinity(0))
        self._process: subprocess.Popen[bytes] | None = None
        self._work: Path | None = None

    def __enter__(self) -> NoisyNeighbour:
        if shutil.which("cmake") is None:
            raise RuntimeError("the noisy neighbour builds with cmake, which is not on PATH")
        self._work = Path(tempfile.mkdtemp(prefix="harness-neighbour-"))
        self._process = subprocess.Popen(
            ["bash", "-c", _LOOP, "neighbour", str(self.tree), str(self._work / "build"),
             str(self.jobs)], start_new_session=True)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        if self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)
