"""An out-of-memory start on demand: a launcher that stands in for llama-server.

A CPU machine cannot run out of GPU memory, yet the launch supervisor's offload ladder is
driven by exactly that event. ``make_oom_launcher`` writes a small POSIX shell script
that the runner starts in place of the llama-server binary. Its first ``fail_first``
starts (counted in a file beside it) print what a CUDA build of the pinned source prints
when the weights do not fit the device, and exit with llama-server's status for it; every
later start ``exec``s the real binary with the same argv, so it is the real server that
then serves. To the harness the injected start is the real event: the same log lines in
the same order, the same exit status.

The lines, in the order a CUDA start prints them when loading the weights fails
(pinned source; the paths are the ``--model`` argument, the size is the model file's,
which is what a launch that puts every layer on the GPU asks for):

1. ggml/src/ggml-cuda/ggml-cuda.cu, ``ggml_backend_cuda_buffer_type_alloc_buffer``:
   ``"%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s\\n"`` with
   ``cudaGetErrorString(cudaErrorMemoryAllocation)`` = ``out of memory``;
2. ggml/src/ggml-backend.cpp, ``ggml_backend_buft_alloc_buffer_n_default`` (the CUDA
   buffer type has no ``alloc_buffer_n`` of its own):
   ``"%s: failed to allocate %s buffer of size %zu\\n"`` with the buffer type ``CUDA0``;
3. src/llama-model.cpp (``load_tensors``) throws ``"unable to allocate %s buffer"``, and
   src/llama.cpp's ``llama_model_load`` logs ``"%s: error loading model: %s\\n"``;
4. src/llama.cpp, ``llama_model_load_from_file_impl``: ``"%s: failed to load model\\n"``;
5. common/common.cpp, ``common_init_from_params``: ``COM_ERR("failed to load model
   '%s'\\n")``, whose prefix ``"cmn  %12.*s: "`` cuts the function name to 12 characters;
6. tools/server/server-context.cpp, ``load_model``: ``SRV_ERR("failed to load model,
   '%s'\\n")`` (prefix ``"srv  %12.*s: "``);
7. tools/server/server.cpp: the clean-up's ``"%s: cleaning up before exit...\\n"`` (INFO)
   and ``SRV_ERR("exiting due to model loading error\\n")``, then ``return 1``.

Each goes through common/log.cpp, which prefixes a timestamp (``M.SS.mmm.uuu``) and the
level letter, as in every llama-server log the harness reads.

The counter is a plain file: the launcher is meant for one supervisor starting servers
one after another, not for concurrent starts.
"""

from __future__ import annotations

import shlex
import stat
from pathlib import Path

#: llama-server's exit status after a failed model load (tools/server/server.cpp).
OOM_EXIT_CODE = 1
#: The name of the injected device: the first CUDA device (``GGML_CUDA_NAME`` + index).
CUDA_DEVICE = "CUDA0"
_COUNTER_SUFFIX = ".starts"

# The lines as printf formats: the shell fills the ``%s`` slots (size in MiB, size in
# bytes, the model path) with values known only when the server is started.
_LINES: tuple[tuple[str, str], ...] = (
    ("E", "ggml_backend_cuda_buffer_type_alloc_buffer: allocating %s MiB on device 0: "
          "cudaMalloc failed: out of memory"),
    ("E", f"ggml_backend_buft_alloc_buffer_n_default: failed to allocate {CUDA_DEVICE} "
          "buffer of size %s"),
    ("E", f"llama_model_load: error loading model: unable to allocate {CUDA_DEVICE} buffer"),
    ("E", "llama_model_load_from_file_impl: failed to load model"),
    ("E", "cmn  common_init_: failed to load model '%s'"),
    ("E", "srv    load_model: failed to load model, '%s'"),
    ("I", "srv    operator(): operator(): cleaning up before exit..."),
    ("E", "srv  llama_server: exiting due to model loading error"),
)
#: Which of the values (mib, bytes, model) each line takes, in order.
_ARGS: tuple[tuple[str, ...], ...] = (
    ('"$mib"',), ('"$size"',), (), (), ('"$model"',), ('"$model"',), (), (),
)


def make_oom_launcher(real_binary: Path, directory: Path, fail_first: int) -> Path:
    """Write the launcher into ``directory`` and return its path (an executable file).

    Its first ``fail_first`` starts fail as a CUDA out-of-memory start; later ones run
    ``real_binary``. The start counter begins at 0 (``starts_seen`` reads it).
    """
    if fail_first < 0:
        raise ValueError(f"fail_first must be 0 or more, got {fail_first}")
    directory.mkdir(parents=True, exist_ok=True)
    launcher = directory / "llama-server-oom"
    counter = _counter_path(launcher)
    counter.write_text("0\n", encoding="utf-8")
    launcher.write_text(_script(real_binary.resolve(), counter, fail_first), encoding="utf-8")
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return launcher


def starts_seen(launcher: Path) -> int:
    """How many times the launcher has been started since it was written."""
    return int(_counter_path(launcher).read_text(encoding="utf-8").strip() or 0)


def _counter_path(launcher: Path) -> Path:
    return launcher.with_name(launcher.name + _COUNTER_SUFFIX)


def _script(real: Path, counter: Path, fail_first: int) -> str:
    printfs = []
    for i, ((level, line), args) in enumerate(zip(_LINES, _ARGS, strict=True)):
        # Timestamps rise like a real log's; their exact values carry no meaning.
        stamp = f"0.00.{120 + i:03d}.{100 * i + 17:03d}"
        fmt = shlex.quote(f"{stamp} {level} {line}\\n")
        printfs.append(" ".join(["printf", fmt, *args]) + " >&2")
    body = "\n".join(printfs)
    return f"""#!/bin/sh
# Out-of-memory injection launcher (harness/supervise/oom_injector.py): stands in for
# llama-server. The first {fail_first} start(s) print what a CUDA build prints when the
# weights do not fit the device and exit {OOM_EXIT_CODE}; later starts run the real binary.
real={shlex.quote(str(real))}
counter={shlex.quote(str(counter))}
n=$(cat "$counter" 2>/dev/null || echo 0)
n=$((n + 1))
echo "$n" > "$counter"
if [ "$n" -gt {fail_first} ]; then
    exec "$real" "$@"
fi
model=
previous=
for arg in "$@"; do
    case "$previous" in
        -m|--model) model=$arg ;;
    esac
    previous=$arg
done
size=0
if [ -f "$model" ]; then
    size=$(wc -c < "$model" | tr -d ' ')
fi
mib=$(awk -v s="$size" 'BEGIN {{ printf "%.2f", s / 1024 / 1024 }}')
{body}
exit {OOM_EXIT_CODE}
"""
