"""ccache for native builds, so that builds of nearby sources share their objects.

The slowed build (``harness/builds/slowed.py``) differs from the pinned one in three
files, and a bisection builds commits a few changes apart: with a compiler cache every
file that did not change is a hit instead of a compile. llama.cpp launches its compilers
through ccache by itself when it finds one (``GGML_CCACHE``); what it cannot do is hit
across two source trees, because the compiler sees each tree's absolute paths. So a
cached build configures CMake with its source through a link inside its own build
directory (``builds/<key>/source``), and ccache rewrites every path under the harness
cache to a relative one (``CCACHE_BASEDIR``): the compiler sees
``../source/ggml/src/ggml.c`` in every build, whichever tree the link points at.

``HARNESS_CCACHE``: unset or ``auto`` uses ``ccache`` from PATH when there is one;
``0`` (or ``off``) builds without any compiler cache; a path names the ccache to use.
The objects go to ``CCACHE_DIR`` when that is set, else ``$HARNESS_CACHE/ccache``
(ccache's own size limit, 5 GB by default, bounds it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError
from harness.facts.build import Backend

CCACHE_ENV = "HARNESS_CCACHE"
_OFF = frozenset({"0", "off", "no", "false"})
_AUTO = frozenset({"", "auto"})
#: What ``auto`` looks for on PATH.
AUTO_PROGRAM = "ccache"
#: The compiler languages a backend's build compiles (each gets the launcher).
_LANGUAGES = {Backend.CUDA: ("C", "CXX", "CUDA")}
#: The link a cached build's CMake sees as its source directory, in its build directory.
SOURCE_LINK = "source"
#: Without a compiler cache llama.cpp must not pick up a ccache on its own either.
NO_CCACHE_FLAG = "-DGGML_CCACHE=OFF"


@dataclass(frozen=True)
class CompilerCache:
    program: str
    #: Where the objects go (``CCACHE_DIR``).
    directory: Path
    #: Paths under it are rewritten to relative ones (``CCACHE_BASEDIR``).
    base_dir: Path

    def cmake_flags(self, backend: Backend) -> tuple[str, ...]:
        """The launcher of every language the build compiles (pure)."""
        languages = _LANGUAGES.get(backend, ("C", "CXX"))
        return tuple(f"-DCMAKE_{lang}_COMPILER_LAUNCHER={self.program}" for lang in languages)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with ccache told where its objects go and which paths to make relative
        (pure). ``hash_dir`` off: a build's own directory differs between two builds of
        the same file, and it only matters for debug information, which Release builds
        do not carry."""
        env = dict(base)
        env.setdefault("CCACHE_DIR", str(self.directory))
        env["CCACHE_BASEDIR"] = str(self.base_dir)
        env["CCACHE_NOHASHDIR"] = "1"
        return env


def compiler_cache(cache: Path, environ: Mapping[str, str] | None = None) -> CompilerCache | None:
    """The compiler cache builds under ``cache`` use, per ``HARNESS_CCACHE``; None: none.

    ConfigError when the variable names a program that is not there.
    """
    env = os.environ if environ is None else environ
    setting = env.get(CCACHE_ENV, "")
    wanted = ccache_program(setting)
    if wanted is None:
        return None
    program = shutil.which(wanted, path=env.get("PATH"))
    if program is None:
        if setting.strip().lower() in _AUTO:
            return None  # none here: build without one, as before there was a cache
        raise ConfigError(
            f"{CCACHE_ENV}={setting!r} is not a program this machine can run: install "
            "ccache (`apt-get install ccache`), name its path, or set "
            f"{CCACHE_ENV}=0 to build without a compiler cache")
    # Not resolved: the compiler sees the paths CMake was given, and those start here.
    root = cache.expanduser().absolute()
    return CompilerCache(program=program, directory=root / "ccache", base_dir=root)


def ccache_program(setting: str) -> str | None:
    """The program a ``HARNESS_CCACHE`` value asks for (pure): None when it turns the cache
    off, ``ccache`` (looked for on PATH) when unset or ``auto``, else the value itself."""
    value = setting.strip()
    if value.lower() in _OFF:
        return None
    return AUTO_PROGRAM if value.lower() in _AUTO else value


def linked_source(build_dir: Path, source: Path) -> Path:
    """``build_dir/source``, a link to ``source`` (made or re-pointed): the path CMake is
    given, the same relative to every build directory."""
    link = build_dir / SOURCE_LINK
    target = source.resolve()
    if link.is_symlink() and link.resolve() == target:
        return link
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)  # not ours to keep: the build directory is the harness's
    link.symlink_to(target, target_is_directory=True)
    return link
