"""The dispatcher hands the plan to its backend unchanged; the real backend starts it.

What "unchanged" means is checked on the server: its props and KV cache lines against
the plan (a stand-in backend could only check that an object was passed along)."""

from __future__ import annotations

import pytest

from harness import modelgen
from harness.client import ServerClient
from harness.errors import ConfigError
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.routing import InferenceBackend
from harness.probes.bundles import load_bundle
from harness.probes.gguf_facts import read_model_facts
from harness.runners.dispatch import Dispatcher, LlamaCppBackend
from harness.runners.subprocess_runner import SubprocessRunner
from harness.verdicts.kv_log import check_kv_plan, parse_kv_cache_lines


def _plan(fixtures: modelgen.FixtureSet, name: str) -> LaunchPlan:
    bundle = load_bundle(fixtures.bundle(name))
    return plan_launch(PlanRequest(
        model_path=bundle.text_model, model=read_model_facts(bundle.text_model), bundle=bundle,
        drafter_model=read_model_facts(bundle.drafter_path) if bundle.drafter_path else None,
    ))


def test_a_route_with_no_backend_is_named(fixture_set: modelgen.FixtureSet) -> None:
    with pytest.raises(ConfigError, match=r"routes to 'llama-cpp'.*set up: none"):
        Dispatcher({}).dispatch(_plan(fixture_set, "fused-dense"))


@pytest.mark.server
@pytest.mark.parametrize("bundle", modelgen.BUNDLE_NAMES)
def test_a_dispatched_plan_runs_as_planned(bundle: str, fixture_set: modelgen.FixtureSet,
                                           server_runner: SubprocessRunner) -> None:
    plan = _plan(fixture_set, bundle)
    server = Dispatcher({InferenceBackend.LLAMA_CPP: LlamaCppBackend(server_runner)}).dispatch(
        plan)
    try:
        with ServerClient(server.base_url) as client:
            props = client.props()
            completion = client.completion("hello", n_predict=8)
        log = server_runner.log_dir.joinpath(server.log_path.name).read_text()
    finally:
        server.stop()
    assert props.model_path == str(plan.spec.model)
    assert props.total_slots == (plan.spec.parallel or 4)
    assert completion.timings.draft_n is not None
    assert completion.timings.draft_n > 0
    assert plan.kv is not None
    lines = parse_kv_cache_lines(log)
    # The target's caches come first; the drafter (or MTP context) adds its own after them.
    assert len(lines) == len(plan.kv.caches) + 1
    assert check_kv_plan(plan.kv, lines[: len(plan.kv.caches)]) is None
