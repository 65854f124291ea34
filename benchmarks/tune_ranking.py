"""What a tune costs here and whether its predicted ranking agrees with the measured one
(issue 26).

    .venv/bin/python benchmarks/tune_ranking.py [--top N] [--budget-s S] [--fixture F]

Runs ``harness tune --json`` on the cached CPU build for a fixture model under a test
card (the RTX 4090's card with a 2048-token context and one slot, so the fixture's
KV cache and batch sizes are what change), every dimension, the ``--top`` best
candidates measured. Prints the wall time, each measured candidate's predicted score
(predicted decode x quality) beside its measured decode ratio x quality, and Spearman's
rank correlation between the two over the candidates measured (ties share their mean
rank). A rank correlation near 1 means the prediction orders the candidates as the
measurement does; near 0, that it does not.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import modelgen
from harness.probes.gpu_configs import GPU_CONFIG_DIR

HARNESS = str(Path(sys.executable).with_name("harness"))
CARD = "TuneBenchCard"


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    if len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    if statistics.pstdev(ra) == 0 or statistics.pstdev(rb) == 0:
        return None  # every value tied on one side: no order to agree with
    return statistics.correlation(ra, rb)


def card_folder(folder: Path) -> Path:
    shutil.copytree(GPU_CONFIG_DIR, folder)
    card = json.loads((folder / "rtx-4090.json").read_text())
    card["llama_server_flags"].update(ctx_size=2048, parallel=1, load_mode="auto")
    card.update(name="tune-bench", match=[CARD], description="The benchmark's card.")
    (folder / "tune-bench.json").write_text(json.dumps(card, indent=2) + "\n")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--fixture", default="bench")
    args = parser.parse_args()
    model = modelgen.ensure_fixtures().model(args.fixture)
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as temp:
        configs = card_folder(Path(temp) / "configs")
        started = time.monotonic()
        done = subprocess.run(
            [HARNESS, "tune", "--model", str(model), "--gpu", CARD, "--vram-mib", "24564",
             "--configs", str(configs), "--top", str(args.top), "--budget-s",
             str(args.budget_s), "--json"], capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    data: dict[str, Any] = json.loads(done.stdout)
    rows = []
    for row in data["candidates"]:
        measured = row["measured"]
        if not measured or measured["error"]:
            continue
        decode = next((d for d in measured["decisions"] if d["metric"] == "decode_tps"), None)
        if decode is None or decode["ratio"] is None or row["score"] is None:
            continue
        rows.append((row["name"], row["score"], decode["ratio"] * (row["quality"] or 1.0),
                     decode["ratio"], decode["verdict"], measured["elapsed_s"]))
    print(f"tune of {len(rows)} measured candidates ({args.fixture}, top {args.top}, "
          f"budget {args.budget_s:g} s): {wall:.0f} s wall")
    print(f"{'candidate':<16} {'predicted score':>16} {'measured':>10} {'decode ratio':>13} "
          f"{'verdict':>10} {'s':>5}")
    for name, score, measured_score, ratio, verdict, seconds in rows:
        print(f"{name:<16} {score:>16.1f} {measured_score:>10.3f} {ratio:>13.3f} "
              f"{verdict:>10} {seconds:>5.0f}")
    rho = spearman([r[1] for r in rows], [r[2] for r in rows])
    print("Spearman's rank correlation, predicted score vs measured decode x quality: "
          + ("undefined (fewer than 3 candidates, or one side all tied)" if rho is None
             else f"{rho:.2f}"))
    print(f"verdict: {data['summary']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
