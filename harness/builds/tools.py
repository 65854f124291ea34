"""Another llama.cpp tool from a native build's own CMake folder (``llama-quantize``, …).

``harness build`` compiles the ``llama-server`` target only, but configures the whole
tree with the tools on (``LLAMA_BUILD_TOOLS``), so another tool of the same source and
flags is one ``cmake --build --target`` away: its own files and a link, seconds with
the objects the server already compiled. The build's folder stays valid for its key:
only a target is added to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.bounded import bounded_lock, run_step
from harness.builds.compiler_cache import compiler_cache
from harness.errors import BuildError
from harness.paths import cache_root

#: Seconds building one tool may take (llama-quantize: about 4 s here with the server's
#: objects compiled; a minute or two from a cold compiler cache).
TOOL_LIMIT_S = 900.0


def build_tool(build_dir: Path, target: str) -> Path:
    """``<build_dir>/cmake-build/bin/<target>``, built once."""
    tree = build_dir / "cmake-build"
    tool = tree / "bin" / target
    if tool.is_file():
        return tool
    if not (tree / "CMakeCache.txt").is_file():
        raise BuildError(f"{build_dir} has no CMake folder to build {target} in; it is not a "
                         "native build of the cache (`harness build`)")
    ccache = compiler_cache(cache_root())
    env = ccache.environment(os.environ) if ccache is not None else None
    with bounded_lock(build_dir / f".{target}.lock", wait_s=TOOL_LIMIT_S,
                      purpose=f"building {target}", error=BuildError,
                      setting="harness.builds.tools.TOOL_LIMIT_S"):
        if tool.is_file():
            return tool
        argv = ["cmake", "--build", str(tree), "--target", target, "-j",
                str(max(1, len(os.sched_getaffinity(0))))]
        run = run_step(argv, step=f"building {target}", limit_s=TOOL_LIMIT_S,
                       setting="harness.builds.tools.TOOL_LIMIT_S", error=BuildError, env=env)
        if run.code != 0 or not tool.is_file():
            raise BuildError(f"building {target} in {tree} failed (exit {run.code}):\n"
                             + "\n".join(run.tail))
    return tool
