"""llama.cpp's eval-callback tool for a native build, and the divergence it locates.

The harness builds only ``llama-server``, with llama.cpp's examples off. Its build
folder (``<build>/cmake-build``) still holds the static libraries the server links, so
``examples/eval-callback/eval-callback.cpp`` of the same source is compiled and linked
against them in a second or two (``<build>/bin/llama-eval-callback``): the same code that
served, with the library's own per-tensor callback (``common/debug.cpp``). CPU builds
only: a GPU build's libraries need their toolkit's runtime at link time too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from harness.bounded import bounded_lock, run_step
from harness.errors import BuildError
from harness.numerics.tensor_dump import (
    TensorDifference,
    TensorDump,
    first_difference,
    parse_dump,
)

TOOL = "llama-eval-callback"
#: The static libraries the tool needs, in link order (each before what it uses).
_LIBRARIES = ("common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a",
              "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a",
              "vendor/hash/libvendor-hash.a", "vendor/cpp-httplib/libcpp-httplib.a")
#: Seconds compiling and linking the tool may take (about 2 s here).
LINK_LIMIT_S = 300.0
#: Seconds one dump may take (a short prompt through a fixture: about a second).
DUMP_LIMIT_S = 300.0
#: The tool's log is written by a thread of its own and can lose its last tensors when
#: the process exits (measured on bench-q4_0, five runs: 181, 195, 195, 192, 195 of 195),
#: so a build is dumped until a print reaches the graph's last tensor, at most this many
#: times, and the longest print is used.
DUMP_TRIES = 6
#: The name llama.cpp's graphs give their last tensor, the logits (src/llama-graph.cpp).
LAST_TENSOR = "result_output"


def eval_callback_tool(build_dir: Path) -> Path:
    """``<build_dir>/bin/llama-eval-callback``, compiled and linked once."""
    tool = build_dir / "bin" / TOOL
    if tool.is_file():
        return tool
    tree, source = build_dir / "cmake-build", build_dir / "source"
    libraries = [tree / lib for lib in _LIBRARIES]
    missing = [str(lib) for lib in libraries if not lib.is_file()]
    example = source / "examples" / "eval-callback" / "eval-callback.cpp"
    if missing or not example.is_file():
        raise BuildError(f"{build_dir} is not a native CPU build with its CMake folder and "
                         f"source ({', '.join(missing) or example} missing); the eval "
                         "callback is linked against those: build it with `harness build`")
    compiler = shutil.which(os.environ.get("CXX", "c++")) or "c++"
    with bounded_lock(build_dir / f".{TOOL}.lock", wait_s=LINK_LIMIT_S,
                      purpose=f"linking {TOOL}", error=BuildError,
                      setting="harness.numerics.eval_callback.LINK_LIMIT_S"):
        if tool.is_file():
            return tool
        partial = tool.with_suffix(".partial")
        includes = [f"-I{source / d}" for d in ("include", "ggml/include", "common", "vendor")]
        argv = [compiler, "-O1", "-std=c++17", *includes, str(example), "-o", str(partial),
                *map(str, libraries), "-fopenmp", "-lpthread", "-ldl"]
        run = run_step(argv, step=f"linking {TOOL}", limit_s=LINK_LIMIT_S,
                       setting="harness.numerics.eval_callback.LINK_LIMIT_S", error=BuildError)
        if run.code != 0:
            raise BuildError(f"linking {TOOL} against {tree} failed (exit {run.code}):\n"
                             + "\n".join(run.tail))
        partial.replace(tool)
    return tool


def dump_tensors(tool: Path, model: Path, prompt: str,
                 env: Mapping[str, str] | None = None) -> str:
    """What the callback prints for one forward pass of ``prompt`` through ``model``."""
    try:
        done = subprocess.run([str(tool), "-m", str(model), "-p", prompt, "-t", "1",
                               "-c", "512"], capture_output=True, text=True,
                              errors="replace", timeout=DUMP_LIMIT_S, check=False,
                              env=None if env is None else dict(env))
    except subprocess.TimeoutExpired:
        raise BuildError(f"{tool} on {model} ran past {DUMP_LIMIT_S:g} s (setting: "
                         "harness.numerics.eval_callback.DUMP_LIMIT_S)") from None
    if done.returncode != 0:
        raise BuildError(f"{tool} on {model} exited {done.returncode}:\n"
                         + done.stderr[-2000:])
    return done.stdout


def locate_divergence(baseline_build: Path, candidate_build: Path, model: Path,
                      prompt: str, env: Mapping[str, str] | None = None
                      ) -> TensorDifference | None:
    """The first tensor where the candidate build's forward pass leaves the baseline's
    (both native CPU build folders, the same ``env`` for both)."""
    baseline, candidate = (_whole_dump(eval_callback_tool(build), model, prompt, env)
                           for build in (baseline_build, candidate_build))
    return first_difference(baseline, candidate)


def _whole_dump(tool: Path, model: Path, prompt: str,
                env: Mapping[str, str] | None) -> list[TensorDump]:
    """The first whole print (one that reaches ``LAST_TENSOR``), else the longest of
    ``DUMP_TRIES``."""
    prints: list[list[TensorDump]] = []
    for _ in range(DUMP_TRIES):
        prints.append(parse_dump(dump_tensors(tool, model, prompt, env)))
        if prints[-1] and prints[-1][-1].name == LAST_TENSOR:
            break
    return max(prints, key=len)
