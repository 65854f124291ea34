"""Why a spread over RPC devices failed, in words that name the device (pure).

llama-server reaches an RPC device over a socket; when the server behind it is gone,
ggml-rpc aborts the whole process (``GGML_ABORT``) with a line that names the source line
but, for a lost connection, not the device: measured on the pinned build,
``ggml-rpc.cpp:566: Remote RPC server crashed or returned malformed response`` half a
second after the device's server was killed mid-run, and ``ggml-rpc.cpp:547: Failed to
connect to 127.0.0.1:50101`` for one that was never there. The client then sees its
connection closed. The harness knows which of its RPC servers exited, so it says which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_RPC_ABORT = re.compile(r"ggml-rpc\.cpp:\d+: (?P<what>[^\n]+?)\s*$", re.MULTILINE)
_ALLOC = re.compile(r"failed to allocate RPC\d+\[(?P<endpoint>[^\]]+)\] buffer of size "
                    r"(?P<size>\d+)")


def rpc_failure(server_log: str, gone: Mapping[str, int | None]) -> str | None:
    """What went wrong with the RPC devices of a failed launch or request, or None when
    nothing points at them. ``gone``: the harness's RPC servers that are no longer running,
    endpoint to exit code (None: not reaped)."""
    aborted = _RPC_ABORT.search(server_log)
    if not gone and aborted is None:
        return None
    parts = [f"RPC device {endpoint} is gone: its rpc-server "
             f"{'exited with ' + str(code) if code is not None else 'is not running'}"
             for endpoint, code in sorted(gone.items())]
    if aborted is not None:
        source = aborted.group(0).split(":", 1)[0]
        parts.append(f"llama-server aborted: {aborted['what']!r} ({source})")
    fix = ("restart the RPC server at that endpoint (or drop it from the device list) and "
           "start llama-server again" if gone else
           "check that every endpoint in --rpc runs an rpc-server of the same build")
    return "; ".join(parts) + f"; {fix}"


def failed_device_allocation(server_log: str) -> tuple[str, int] | None:
    """The RPC endpoint and bytes of the first buffer a device could not allocate
    (``failed to allocate RPC0[HOST:PORT] buffer of size N``), None for none."""
    found = _ALLOC.search(server_log)
    return (found["endpoint"], int(found["size"])) if found else None
