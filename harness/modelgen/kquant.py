"""K-quant copies of a fixture, made by the pinned build's own ``llama-quantize``.

gguf-py quantizes Q8_0, Q4_0 and Q4_1 (``harness.modelgen.writer``) but not the K-quants
users run most (Q4_K, Q6_K), so those copies come from llama.cpp's quantizer of the
pinned source — never the build under test, so a build with a broken quantizer is still
fed the right file. ``--pure`` asks for the one type everywhere; a matrix whose rows are
not whole 256-value super-blocks falls back to the quantizer's own choice (on ``bench``,
384-wide rows: Q5_0 under Q4_K, Q8_0 under Q6_K; the 1024-wide ``ffn_down`` rows are
K-quants). The copies are written on demand, once per source file, type and quantizer,
under ``<cache>/fixtures-kquant/``: the quantizer is deterministic (the same bytes twice,
measured), and no hash of them is committed, since they follow from the pin.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.bounded import bounded_lock, run_step
from harness.errors import FixtureError
from harness.files import sha256_file
from harness.paths import cache_root

#: The K-quant types the numerics suite covers: llama-quantize's names.
KQUANT_TYPES = ("Q4_K", "Q6_K")
#: Seconds one quantization may take (bench: well under one).
QUANTIZE_LIMIT_S = 300.0


def kquant_copy(source: Path, qtype: str, quantize: Path, cache: Path | None = None) -> Path:
    """``source`` quantized to ``qtype`` by the ``quantize`` tool, made once."""
    if qtype not in KQUANT_TYPES:
        raise FixtureError(f"{qtype!r} is not a K-quant type the fixtures make "
                           f"({', '.join(KQUANT_TYPES)})")
    digest = hashlib.sha256(f"{sha256_file(source)} {qtype} {sha256_file(quantize)}".encode())
    folder = (cache or cache_root()) / "fixtures-kquant" / digest.hexdigest()[:16]
    target = folder / f"{source.stem}-{qtype.lower()}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with bounded_lock(folder / ".lock", wait_s=QUANTIZE_LIMIT_S, purpose=f"quantizing "
                      f"{source.name} to {qtype}", error=FixtureError,
                      setting="harness.modelgen.kquant.QUANTIZE_LIMIT_S"):
        if target.is_file():
            return target
        partial = target.with_suffix(".partial")
        run = run_step([str(quantize), "--pure", str(source), str(partial), qtype, "1"],
                       step=f"llama-quantize {source.name} {qtype}", limit_s=QUANTIZE_LIMIT_S,
                       setting="harness.modelgen.kquant.QUANTIZE_LIMIT_S", error=FixtureError)
        if run.code != 0 or not partial.is_file():
            raise FixtureError(f"{quantize} could not quantize {source} to {qtype} (exit "
                               f"{run.code}):\n" + "\n".join(run.tail))
        partial.replace(target)
    return target
