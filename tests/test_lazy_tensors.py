"""Lazily read tensors: which ones a launch reads from the file on demand, planned from the
GGUF. The real loader's side is suites/test_plan_forwarding.py (the ``ple-lazy-*`` cases)."""

from __future__ import annotations

import dataclasses

import pytest

from harness import modelgen
from harness.facts.build import Capabilities
from harness.facts.gpu import LazyMode
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.lazy_tensors import AUTO_MIN_BYTES, plan_lazy
from harness.probes.gguf_facts import read_model_facts

PLE = "per_layer_token_embd.weight"
KNOWN = Capabilities(flags=("--lazy-mode",))
#: A gemma4 E2B-like per-layer embedding table (262144 x 35 x 256 in bf16: 4.4 GiB) and a
#: small one.
BIG = ((PLE, 262144 * 35 * 256 * 2),)
SMALL = ((PLE, 17216),)


@pytest.mark.parametrize(("marked", "mode", "tensors"), [
    (SMALL, LazyMode.ON, (PLE,)),
    (SMALL, LazyMode.AUTO, ()),
    (SMALL, None, ()),
    (SMALL, LazyMode.OFF, ()),
    (BIG, None, (PLE,)),
    (BIG, LazyMode.AUTO, (PLE,)),
    (BIG, LazyMode.OFF, ()),
    ((), LazyMode.ON, ()),
])
def test_the_mode_decides_which_marked_tensors_are_read_lazily(
        marked: tuple[tuple[str, int], ...], mode: LazyMode | None,
        tensors: tuple[str, ...]) -> None:
    plan = plan_lazy(marked, mode, KNOWN)
    assert plan.tensors == tensors
    assert plan.lazy_bytes == sum(size for name, size in marked if name in tensors)


def test_auto_takes_only_tensors_over_its_threshold() -> None:
    # Strictly over: src/llama-model-loader.cpp keeps a tensor of exactly 4 GiB resident.
    assert plan_lazy(((PLE, AUTO_MIN_BYTES),), None, KNOWN).tensors == ()
    assert plan_lazy(((PLE, AUTO_MIN_BYTES + 1),), None, KNOWN).tensors == (PLE,)
    # A lowered threshold shows the auto rule on a small file.
    assert plan_lazy(SMALL, LazyMode.AUTO, KNOWN, auto_min_bytes=1024).tensors == (PLE,)


def test_the_reasons_say_what_stays_resident_and_why() -> None:
    assert "the default" in plan_lazy(SMALL, None, KNOWN).reason
    assert "stay resident" in plan_lazy(SMALL, None, KNOWN).reason
    assert "read lazily, not resident: per_layer_token_embd.weight (4480 MiB)" in plan_lazy(
        BIG, None, KNOWN).reason
    older = plan_lazy(BIG, None, Capabilities(flags=("--ctx-size",)))
    assert older.tensors == ()
    assert "has no --lazy-mode" in older.reason


def test_the_gguf_names_the_marked_tensors_of_its_architecture() -> None:
    fixtures = modelgen.ensure_fixtures()
    assert read_model_facts(fixtures.model("ple")).lazy_marked == ((PLE, 269 * 16 * 4),)
    assert read_model_facts(fixtures.model("dense")).lazy_marked == ()


def test_the_plan_sends_the_mode_and_carries_the_lazy_tensors() -> None:
    model = modelgen.ensure_fixtures().model("ple")
    request = PlanRequest(model_path=model, model=read_model_facts(model),
                          per_call={"lazy_mode": "on", "ctx_size": 512})
    plan = plan_launch(request)
    argv = plan.to_argv("llama-server", "127.0.0.1", 0)
    assert argv[argv.index("--lazy-mode") + 1] == "on"
    assert plan.lazy is not None
    assert plan.lazy.tensors == (PLE,)
    assert plan.to_json()["lazy"]["bytes"] == 269 * 16 * 4
    assert any("read lazily, not resident" in r for r in plan.reasons)
    unset = plan_launch(dataclasses.replace(request, per_call={"ctx_size": 512}))
    assert "--lazy-mode" not in unset.to_argv("llama-server", "127.0.0.1", 0)
    assert unset.lazy is not None
    assert unset.lazy.tensors == ()


def test_a_build_without_the_option_is_not_sent_it() -> None:
    model = modelgen.ensure_fixtures().model("ple")
    plan = plan_launch(PlanRequest(
        model_path=model, model=read_model_facts(model), per_call={"lazy_mode": "on"},
        capabilities=Capabilities(flags=("--ctx-size", "--model"))))
    assert "--lazy-mode" in plan.unsupported
