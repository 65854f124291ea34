"""Crashed starts kept per build and model, the quarantine's verdict, and the instruction
sets a build that cannot run here asked for (the book on disk, the rest pure).

The real failing starts (a build for an instruction set this CPU lacks, a real abort)
are in tests/test_cannot_run_here.py and tests/test_supervisor.py.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.supervise.strikes import QUARANTINE_STRIKES, StrikeBook, quarantine_verdict
from harness.verdicts.failure import FailureClass, StartFailure
from harness.verdicts.instruction_sets import host_isa_flags, isa_mismatch

ABORT = StartFailure(FailureClass.CRASH, "ggml.c:1234: GGML_ASSERT(x) failed", -6)
SIGILL = StartFailure(FailureClass.CANNOT_RUN_HERE, "killed by SIGILL (signal 4)", -4)
LOG = "\n".join(f"0.00.00{i}.000 I line {i}" for i in range(10)) + "\n"


def test_three_crashes_in_a_row_quarantine_the_build_for_that_model(tmp_path: Path) -> None:
    book, model = StrikeBook(tmp_path / "strikes"), tmp_path / "dense.gguf"
    for number in range(1, QUARANTINE_STRIKES):
        assert len(book.record("cpu-1", model, ABORT, LOG)) == number
        assert book.quarantine("cpu-1", model) is None
    book.record("cpu-1", model, SIGILL, "")
    verdict = book.quarantine("cpu-1", model)
    assert verdict is not None
    assert verdict.startswith(f"quarantined: build cpu-1 crashed 3 starts in a row with {model}")
    assert "crash (killed by signal 6): ggml.c:1234: GGML_ASSERT(x) failed" in verdict
    assert "cannot-run-here (killed by signal 4)" in verdict
    assert "| 0.00.009.000 I line 9" in verdict  # the log's last lines
    assert "| 0.00.003.000 I line 3" not in verdict
    assert f"lift it by deleting {book.path('cpu-1', model)}" in verdict
    # Another build, or another model, has its own count.
    assert book.quarantine("cpu-2", model) is None
    assert book.quarantine("cpu-1", tmp_path / "moe.gguf") is None


def test_a_good_start_clears_the_strikes(tmp_path: Path) -> None:
    book, model = StrikeBook(tmp_path / "strikes"), tmp_path / "dense.gguf"
    book.record("cpu-1", model, ABORT, LOG)
    book.record("cpu-1", model, ABORT, LOG)
    book.clear("cpu-1", model)
    assert book.strikes("cpu-1", model) == ()
    assert len(book.record("cpu-1", model, ABORT, LOG)) == 1


def _strike(root: str, model: str) -> None:
    StrikeBook(Path(root)).record("cpu-1", Path(model), ABORT, LOG)


def test_concurrent_workers_lose_no_strike(tmp_path: Path) -> None:
    model = tmp_path / "dense.gguf"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_strike, args=(str(tmp_path / "s"), str(model)))
               for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert len(StrikeBook(tmp_path / "s").strikes("cpu-1", model)) == 4


def test_an_unreadable_book_names_itself_and_the_fix(tmp_path: Path) -> None:
    book, model = StrikeBook(tmp_path / "strikes"), tmp_path / "dense.gguf"
    path = book.path("cpu-1", model)
    path.parent.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(HarnessError, match=r"strike book .* cannot be read .* delete it"):
        book.quarantine("cpu-1", model)


def test_the_verdict_is_pure_words(tmp_path: Path) -> None:
    text = quarantine_verdict("cpu-1", Path("/m.gguf"), (), tmp_path / "b" / "x.json")
    assert "crashed 0 starts" in text


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse4_1 sse4_2 avx f16c fma bmi2 avx2
"""


def test_host_flags_come_from_cpuinfo() -> None:
    assert {"avx2", "fma", "f16c"} <= host_isa_flags(CPUINFO)
    assert host_isa_flags("processor: 0\n") == frozenset()


def test_the_mismatch_names_what_the_build_asked_for_and_the_host_lacks() -> None:
    host = host_isa_flags(CPUINFO)
    found = isa_mismatch(["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=ON",
                          "-DGGML_AVX512_BF16:BOOL=ON"], host)
    assert found.asked == ("avx2", "avx512f", "avx512_bf16")
    assert found.missing == ("avx512f", "avx512_bf16")
    assert not found.native
    assert found.describe().startswith("the build asked for avx512f, avx512_bf16, which "
                                       "this CPU lacks (it has avx, avx2")
    native = isa_mismatch(["-DGGML_CUDA=ON"], host)
    assert native.native
    assert "GGML_NATIVE for the CPU that compiled it" in native.describe()
    portable = isa_mismatch(["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON"], host)
    assert "a library it loads" in portable.describe()
