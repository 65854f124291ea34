"""Wall time of the no-regression suites with a warm build, at -n 1 and -n 2.

Builds nothing itself (run `harness build --backend cpu` first); runs the suites
twice through xdist and prints both times and the speedup (targets: <= 60 s at -n 2 on
2 cores, speedup >= 1.6). The per-launch overhead against a bare server start is
benchmarks/startup_overhead.py.

    .venv/bin/python benchmarks/suites_wall.py [PYTEST_ARGS...]
"""

from __future__ import annotations

import subprocess
import sys
import time

from harness.paths import SUITES_DIR, suites_pytest_config


def run_suites(workers: int, extra: list[str]) -> tuple[float, int]:
    argv = [sys.executable, "-m", "pytest", str(SUITES_DIR), *suites_pytest_config(), "-q",
            "-p", "no:cacheprovider", "-n", str(workers), *extra]
    started = time.perf_counter()
    code = subprocess.call(argv, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, code


def main() -> None:
    extra = sys.argv[1:]
    run_suites(2, extra)  # warm the fixture cache and the page cache first
    one, code_one = run_suites(1, extra)
    two, code_two = run_suites(2, extra)
    print(f"suites at -n 1: {one:.1f} s (pytest exit {code_one})")
    print(f"suites at -n 2: {two:.1f} s (pytest exit {code_two}; target <= 60 s)")
    print(f"speedup: {one / two:.2f} (target >= 1.6)")
    sys.exit(code_one or code_two)


if __name__ == "__main__":
    main()
