"""A recorded server command line, rewritten to run here (pure).

The argv a test started is recorded with the paths of the machine that ran it: the
binary in its build cache and the fixtures in its fixture cache. The fixture files keep
their names and their place under the fixture root (``models/dense.gguf``,
``bundles/fused-dense/...``), so each recorded path is mapped to the local file with the
longest matching tail; a path that is not a fixture (a test's own temporary file) is
left as it is and reported.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit


@dataclass(frozen=True)
class LocalCommand:
    argv: tuple[str, ...]
    #: Recorded absolute paths that match no local fixture, as they were.
    unmapped: tuple[str, ...]

    def shell(self) -> str:
        return shlex.join(self.argv)


def fixture_index(root: Path) -> dict[str, Path]:
    """Every file and directory under a fixture root, by its path relative to the root."""
    return {path.relative_to(root).as_posix(): path for path in root.rglob("*")}


def map_path(recorded: str, index: Mapping[str, Path]) -> Path | None:
    """The local fixture whose relative path is the longest tail of ``recorded``."""
    parts = PurePosixPath(recorded).parts[1:]  # without the leading "/"
    for start in range(len(parts)):
        local = index.get("/".join(parts[start:]))
        if local is not None:
            return local
    return None


def local_command(argv: Sequence[str], binary: str, index: Mapping[str, Path]) -> LocalCommand:
    """``argv`` with the binary replaced and every fixture path mapped into ``index``."""
    mapped = [binary]
    unmapped = []
    for arg in argv[1:]:
        local = map_path(arg, index) if arg.startswith("/") else None
        if arg.startswith("/") and local is None:
            unmapped.append(arg)
        mapped.append(str(local) if local is not None else arg)
    return LocalCommand(tuple(mapped), tuple(unmapped))


def _with_value(argv: Sequence[str], flag: str, value: str) -> Iterator[str]:
    args = iter(argv)
    for arg in args:
        yield arg
        if arg == flag:
            next(args, None)
            yield value


def for_external(command: LocalCommand, url: str) -> LocalCommand:
    """The command with ``--host``/``--port`` set to where ``url`` says the server listens."""
    parts = urlsplit(url)
    argv: Sequence[str] = command.argv
    if parts.hostname:
        argv = list(_with_value(argv, "--host", parts.hostname))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return LocalCommand(tuple(_with_value(argv, "--port", str(port))), command.unmapped)


def docker_command(command: LocalCommand, image: str) -> LocalCommand:
    """A container run's command as ``docker run``: host network, fixtures mounted
    read-only at their own paths, the image's entrypoint being the server (as the
    container runner starts it)."""
    mounts = sorted({arg for arg in command.argv[1:]
                     if arg.startswith("/") and arg not in command.unmapped})
    argv = ["docker", "run", "--rm", "--network", "host"]
    for path in mounts:
        argv += ["-v", f"{path}:{path}:ro"]
    return LocalCommand((*argv, image, *command.argv[1:]), command.unmapped)
