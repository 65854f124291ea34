"""A tune's winner written into a card (``tuned``) and planned with as the ``tuned`` layer."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness import modelgen
from harness.ab.decision import MetricDecision
from harness.ab.stats import RatioInterval
from harness.commands._card_write import write_card_checked
from harness.commands.plan import plan_request
from harness.errors import ConfigError
from harness.planning.launch_plan import plan_launch
from harness.planning.offload import OffloadKind
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs
from harness.results.rules import AbVerdict
from harness.results.run_record import Hardware
from harness.tune.candidates import SLOTS, TuneSpace, plan_candidates
from harness.tune.card_entry import not_writable, tuned_entry, tuned_key, with_tuned
from harness.tune.quality import load_kv_quality
from harness.tune.winner import Measured

RTX_4090 = ("NVIDIA GeForce RTX 4090", 24564)
HERE = Hardware(host="runner-1", cpu="a CPU")


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "gpu"
    shutil.copytree(GPU_CONFIG_DIR, folder)
    return folder


def _plan(folder: Path, gpu: tuple[str, int] = RTX_4090, **call: Any):  # type: ignore[no-untyped-def]
    model = modelgen.ensure_fixtures().model("bench")
    request = plan_request(None, model, gpu_name=gpu[0], vram_mib=gpu[1], build=None,
                           overrides=call, configs=folder)
    return request, plan_launch(request)


def _winner(folder: Path) -> tuple[Measured, Any, str]:
    request, _ = _plan(folder)
    space = TuneSpace(request=request, weights=load_kv_quality(), bandwidths="not needed",
                      host_cores=None, dimensions=(SLOTS,))
    current, ranked = plan_candidates(space)
    decision = MetricDecision("decode_tps", AbVerdict.IMPROVED,
                              RatioInterval(1.2, 1.1, 1.3, 0.95, 8), 100.0, 120.0, 8)
    return Measured(ranked[0], decisions=(decision,)), current, request.model.architecture


def _write(folder: Path, measured_at: str = "2026-12-03T08:00:00Z") -> tuple[Path, str, str]:
    winner, current, architecture = _winner(folder)
    key, ctx = tuned_key(current, architecture)
    entry = tuned_entry(winner, current, build_key="cpu-0123", hardware=HERE,
                        measured_at=measured_at, threshold=0.05)
    path = folder / "rtx-4090.json"
    write_card_checked(path, with_tuned(json.loads(path.read_text()), key, ctx, entry),
                       section="tuned", error=ConfigError)
    return path, key, ctx


def test_the_winner_is_written_with_its_provenance_and_planned_as_the_tuned_layer(
        tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _, before = _plan(folder)
    path, key, ctx = _write(folder)
    card = json.loads(path.read_text())
    entry = card["tuned"][key][ctx]
    assert key == "model:llama"
    assert ctx == str(before.tune.settings.ctx_size)
    assert entry["settings"] == {"parallel": 1}
    provenance = entry["provenance"]
    assert provenance["replaces"] == {"parallel": before.spec.parallel}
    assert provenance["build_key"] == "cpu-0123"
    assert provenance["hardware"] == {"host": "runner-1", "cpu": "a CPU", "gpu": "none",
                                      "vram_mib": None}
    assert provenance["evidence"][0] == {"metric": "decode_tps", "verdict": "improved",
                                         "ratio": 1.2, "low": 1.1, "high": 1.3, "pairs": 8}
    _, after = _plan(folder)
    assert after.spec.parallel == 1
    assert after.origins["parallel"] == "tuned"
    assert after.to_json()["fields"]["parallel"] == {"value": 1, "origin": "tuned"}
    assert any("tuned 'model:llama' at context" in reason for reason in after.reasons)
    # Another context was not measured: it keeps the card's values.
    _, other = _plan(folder, ctx_size=4096)
    assert other.origins["parallel"] != "tuned"
    # Nor does a card the VRAM bucket borrows for another GPU get it.
    _, borrowed = _plan(folder, gpu=("Some Other 24 GB Card", 24564))
    assert borrowed.tune.config is not None
    assert "tuned" not in borrowed.origins.values()


def test_a_rewrite_of_the_same_entry_changes_no_byte_and_keeps_the_others(
        tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    path, key, ctx = _write(folder)
    first = path.read_bytes()
    card = json.loads(first)
    # The same entry written again (the plan now starts from it, so a second tune
    # would measure other candidates: this is the writer's own stability).
    write_card_checked(path, with_tuned(card, key, ctx, card["tuned"][key][ctx]),
                       section="tuned", error=ConfigError)
    assert path.read_bytes() == first
    kept = with_tuned(card, "eliza-1-9b", "8192", card["tuned"][key][ctx])
    again = with_tuned(kept, key, ctx, {**card["tuned"][key][ctx],
                                        "settings": {"ubatch_size": 256}})
    # The earlier winner's setting stays beside the new one; the other key is untouched.
    assert again["tuned"][key][ctx]["settings"] == {"parallel": 1, "ubatch_size": 256}
    assert again["tuned"]["eliza-1-9b"] == kept["tuned"]["eliza-1-9b"]


def test_a_tuned_entry_that_breaks_the_cards_rules_is_refused_and_nothing_written(
        tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    path = folder / "rtx-4090.json"
    before = path.read_bytes()
    card = json.loads(before)
    path_, key, ctx = _write(_folder(tmp_path / "other"))
    entry = json.loads(path_.read_text())["tuned"][key][ctx]
    bad = with_tuned(card, key, ctx, {**entry, "settings": {"ubatch_size": 4096}})
    with pytest.raises(ConfigError, match=r"tuned section would not be valid.*ubatch_size"):
        write_card_checked(path, bad, section="tuned", error=ConfigError)
    unknown = with_tuned(card, key, "some", entry)
    with pytest.raises(ConfigError, match="tuned"):
        write_card_checked(path, unknown, section="tuned", error=ConfigError)
    assert path.read_bytes() == before
    assert load_gpu_configs(folder)


def test_a_threads_winner_is_not_a_card_setting(tmp_path: Path) -> None:
    winner, _, _ = _winner(_folder(tmp_path))
    threads = replace(winner, candidate=replace(winner.candidate, changes={}, threads=1))
    assert "threads are the launcher's" in str(not_writable(threads))
    drafter_off = replace(winner, candidate=replace(winner.candidate, changes={},
                                                    spec_type="none"))
    assert "changes speculation, which a card does not set" in str(not_writable(drafter_off))
    split = replace(winner, candidate=replace(
        winner.candidate, changes={}, avoid_offload=frozenset({OffloadKind.N_CPU_MOE})))
    assert "changes where weights go" in str(not_writable(split))
    assert not_writable(winner) is None
