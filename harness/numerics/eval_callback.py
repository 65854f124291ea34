"""llama.cpp's eval-callback tool for a native build, and the divergence it locates.

The harness builds only ``llama-server``, with llama.cpp's examples off. Its build
folder (``<build>/cmake-build``) still holds the static libraries the server links, so
``examples/eval-callback/eval-callback.cpp`` of the same source is compiled and linked
against them in a second or two (``<build>/bin/harness-eval-callback``): the same code
that served, with the library's own per-tensor callback (``common/debug.cpp``). CPU builds
only: a GPU build's libraries need their toolkit's runtime at link time too.

The callback prints through llama.cpp's logger, whose worker thread writes a queue that
is never drained at exit (``common_log_main`` leaks it on purpose), so the example alone
loses the last tensors of its print whenever that thread falls behind: 14 of 20 runs on
bench-q4_0 with two busy loops beside it (181-190 of 195 tensors), which is all of the
``q4-dot`` error's one tensor, ``result_output``. ``_DRAIN_SOURCE`` is linked in with
the example and drains the queue when the process exits: 25 of 25 whole prints under
three busy loops.
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

#: The example linked with ``_DRAIN_SOURCE``; its own name (not the example's
#: ``llama-eval-callback``) so a tool linked without the drain is never reused.
TOOL = "harness-eval-callback"
EXAMPLE = Path("examples") / "eval-callback" / "eval-callback.cpp"
#: A static object whose destructor, run when ``main`` returns, stops the logger's worker
#: thread after it has written every queued line (``common_log_pause``: it queues an end
#: entry and joins the thread). In ``common/log.h`` of every llama.cpp since its logger.
_DRAIN_SOURCE = """// harness: drain the log queue at exit (harness/numerics/eval_callback.py)
#include "log.h"
namespace {
struct drain_log_at_exit {
    ~drain_log_at_exit() { common_log_pause(common_log_main()); }
} drain_log;
}
"""
#: The static libraries the tool needs, in link order (each before what it uses).
_LIBRARIES = ("common/libllama-common.a", "common/libllama-common-base.a", "src/libllama.a",
              "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a",
              "vendor/hash/libvendor-hash.a", "vendor/cpp-httplib/libcpp-httplib.a")
#: Seconds compiling and linking the tool may take (about 2 s here).
LINK_LIMIT_S = 300.0
#: Seconds one dump may take (a short prompt through a fixture: about a second).
DUMP_LIMIT_S = 300.0
#: Dumps of one build until a print reaches the graph's last tensor. With the drain one
#: is enough; a print cut short anyway (the process killed) is tried again.
DUMP_TRIES = 3
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
    example = source / EXAMPLE
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
        partial, drain = tool.with_suffix(".partial"), tool.with_suffix(".drain.cpp")
        drain.write_text(_DRAIN_SOURCE)
        includes = [f"-I{source / d}" for d in ("include", "ggml/include", "common", "vendor")]
        argv = [compiler, "-O1", "-std=c++17", *includes, str(example), str(drain),
                "-o", str(partial), *map(str, libraries), "-fopenmp", "-lpthread", "-ldl"]
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
    (both native CPU build folders, the same ``env`` for both); None when every tensor
    of both whole prints agrees."""
    baseline, candidate = (_whole_dump(eval_callback_tool(build), model, prompt, env)
                           for build in (baseline_build, candidate_build))
    return compare_prints(baseline, candidate)


def compare_prints(baseline: list[TensorDump],
                   candidate: list[TensorDump]) -> TensorDifference | None:
    """The first tensor that differs, or None when both prints are whole and agree. A
    print that ends before ``LAST_TENSOR`` cannot say the rest agrees, and one tensor
    printed whole with more or fewer values than the other is a garbled print, not a
    difference (seen once without the drain: a value written twice as the process exited,
    which named kqv_out-5 instead of result_output): a BuildError."""
    found = first_difference(baseline, candidate)
    if found is not None and None not in (found.baseline.sum, found.candidate.sum) \
            and len(found.baseline.values) != len(found.candidate.values):
        raise BuildError(f"the prints of {found.candidate.name} (node {found.index}) hold "
                         f"{len(found.baseline.values)} and {len(found.candidate.values)} "
                         "values for the same shape: a print is garbled")
    cut = [f"the {which} build's print ended after {len(dump)} tensors"
           + (f" ({dump[-1].name})" if dump else "")
           for which, dump in (("baseline", baseline), ("candidate", candidate))
           if not dump or dump[-1].name != LAST_TENSOR]
    if found is None and cut:
        raise BuildError(f"the tensors both prints hold agree, but {' and '.join(cut)}, "
                         f"before the graph's last ({LAST_TENSOR}); the rest is unknown")
    return found


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
