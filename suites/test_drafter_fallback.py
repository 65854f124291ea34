"""Drafter fallback: a drafter that breaks the start, costs context or needs a missing MTP
head is left out, and the server still serves (reference 002's launch behaviour,
docs/references.md).

Every start goes through the launch supervisor, so a failed start is retried the way a
production runtime would retry it, and each test reads the supervisor's attempt record
as well as what the server itself reports (its log, ``timings.draft_n``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.under_test import BuildUnderTest
from harness.client import Completion, ServerClient
from harness.facts.build import Capabilities
from harness.facts.gpu import GpuInfo
from harness.facts.model_facts import ModelFacts
from harness.planning.drafter import DRAFT_MTP, BrokenDrafters
from harness.planning.kv import kv_bytes_per_token, layout_from_facts
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.retry import without_drafter
from harness.plugin import PlanFor
from harness.probes.bundles import load_bundle
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_gpu_configs
from harness.runners.subprocess_runner import SubprocessRunner, SubprocessServer
from harness.supervise.supervisor import AttemptOutcome, LaunchSupervisor, SupervisedLaunch
from harness.verdicts.failure import FailureClass

pytestmark = pytest.mark.server

PROMPT = "Once upon a time"
#: Greedy, seeded, no early stop: two launches of one model must produce the same tokens.
EXACT = {"ignore_eos": True, "seed": 42, "return_tokens": True}
#: An RTX 4090 as its probe reports it; configs/gpu/rtx-4090.json matches it by name.
RTX_4090 = GpuInfo("NVIDIA GeForce RTX 4090", 24564)
MIB = 1024 * 1024
#: The log lines of a speculative start (common/speculative.cpp of the pinned source).
MTP_CONTEXT = "creating MTP draft context against the target model"
VOCABS_DIFFER = "the target and draft vocabs are not compatible"

Supervise = Callable[[LaunchPlan], SupervisedLaunch[SubprocessServer]]


@pytest.fixture
def broken() -> BrokenDrafters:
    return BrokenDrafters()


@pytest.fixture
def supervise(server_runner: SubprocessRunner, harness_build: BuildUnderTest,
              broken: BrokenDrafters) -> Iterator[Supervise]:
    """``supervise(plan)``: a supervised start of the plan; its server is stopped after."""
    servers: list[SubprocessServer] = []

    def run(plan: LaunchPlan) -> SupervisedLaunch[SubprocessServer]:
        supervisor = LaunchSupervisor(server_runner, harness_build.key, broken,
                                      read_model_facts(plan.spec.model))
        launch = supervisor.launch(plan)
        servers.append(launch.server)
        return launch

    yield run
    for server in servers:
        server.stop()


def _complete(launch: SupervisedLaunch[SubprocessServer]) -> Completion:
    with ServerClient(launch.server.base_url) as client:
        return client.completion(PROMPT, n_predict=16, **EXACT)


@pytest.mark.parametrize("case", ["bundle-drafts-accepted", "moe-drafts-rejected"])
def test_a_compatible_drafter_speculates_and_changes_no_token(
        case: str, plan_for: PlanFor, supervise: Supervise,
        fixture_set: modelgen.FixtureSet) -> None:
    """Greedy verification keeps exactly the target's tokens, drafts accepted or not.

    The fused-dense bundle's drafter agrees with its target (both fixtures are aligned on
    one token), so every draft is accepted; the moe fixture has random weights and the
    same vocab, so the drafter's guesses are rejected and the output varies token by
    token: the comparison then proves speculation changed nothing.
    """
    if case == "bundle-drafts-accepted":
        plan = plan_for(bundle="fused-dense")
    else:
        drafter = fixture_set.model("drafter")
        plan = plan_for(model="moe", explicit_spec_type="draft-simple",
                        explicit_drafter=drafter, drafter_model=read_model_facts(drafter))
    assert plan.spec.spec_type == "draft-simple"
    assert plan.spec.drafter is not None
    with_drafter = _complete(supervise(plan))
    without = _complete(supervise(dataclasses.replace(plan, spec=without_drafter(plan.spec))))
    assert with_drafter.timings.draft_n is not None
    assert with_drafter.timings.draft_n > 0
    assert without.timings.draft_n is None
    assert with_drafter.tokens_predicted == without.tokens_predicted == 16
    assert with_drafter.raw["tokens"] == without.raw["tokens"]
    assert with_drafter.content == without.content
    accepted = with_drafter.timings.draft_n_accepted
    if case == "bundle-drafts-accepted":
        assert accepted is not None
        assert accepted > 0
    else:
        assert len(set(without.raw["tokens"])) > 1, "a one-token output proves nothing"


def test_a_corrupt_drafter_fails_the_start_and_the_retry_serves_without_it(
        plan_for: PlanFor, supervise: Supervise, fixture_set: modelgen.FixtureSet,
        broken: BrokenDrafters, harness_build: BuildUnderTest) -> None:
    corrupt = fixture_set.model("drafter-corrupt")
    # The file cannot be read for facts (it is truncated), so none are given.
    plan = plan_for(bundle="fused-dense", explicit_drafter=corrupt, drafter_model=None)
    assert plan.spec.drafter == corrupt
    launch = supervise(plan)
    first, second = launch.attempts
    assert first.failure is not None
    assert first.failure.kind is FailureClass.DRAFTER_LOAD
    # The server's own words, quoted in the record.
    assert first.failure.evidence.endswith(f"failed to load draft model, '{corrupt}'")
    assert f"failed to load draft model, '{corrupt}'" in first.log_text
    assert first.failure.exit_code == 1
    assert "retried without speculative decoding" in first.action
    assert (second.failure, second.outcome) == (None, AttemptOutcome.SERVED)
    assert (second.spec.drafter, second.spec.spec_type) == (None, None)
    assert _complete(launch).tokens_predicted == 16
    # Remembered for this build: the next plan leaves it out before any start.
    assert (harness_build.key, str(corrupt)) in broken.snapshot()
    again = plan_for(bundle="fused-dense", explicit_drafter=corrupt, drafter_model=None,
                     broken_drafters=broken.snapshot())
    assert again.spec.drafter is None
    assert any("it broke an earlier start" in reason for reason in again.reasons)


def test_draft_mtp_is_never_planned_for_a_model_without_a_head(plan_for: PlanFor) -> None:
    plan = plan_for(model="dense", explicit_spec_type=DRAFT_MTP)
    assert plan.spec.spec_type is None
    assert any("dropped" in reason and "failed to create MTP context" in reason
               for reason in plan.reasons)


def test_a_forced_draft_mtp_start_is_recovered_by_the_same_retry(
        plan_for: PlanFor, supervise: Supervise, broken: BrokenDrafters,
        harness_build: BuildUnderTest) -> None:
    plan = plan_for(model="dense")
    forced = dataclasses.replace(plan, spec=dataclasses.replace(
        plan.spec, spec_type=DRAFT_MTP, ctx_size=512, parallel=1))
    launch = supervise(forced)
    first, second = launch.attempts
    assert first.failure is not None
    assert first.failure.kind is FailureClass.MTP_CONTEXT
    assert first.failure.evidence.endswith("failed to create MTP context")
    assert MTP_CONTEXT in first.log_text
    assert (second.spec.spec_type, second.outcome) == (None, AttemptOutcome.SERVED)
    assert (harness_build.key, str(plan.spec.model)) in broken.snapshot()
    assert _complete(launch).timings.draft_n is None


def test_the_mtp_bundle_drafts_with_its_own_head(plan_for: PlanFor,
                                                 supervise: Supervise) -> None:
    plan = plan_for(bundle="fused-mtp")
    assert (plan.spec.spec_type, plan.spec.drafter, plan.spec.parallel) == (DRAFT_MTP, None, 1)
    launch = supervise(plan)
    assert [a.outcome for a in launch.attempts] == [AttemptOutcome.SERVED]
    log = launch.server.log_text()
    assert MTP_CONTEXT in log
    assert "adding speculative implementation 'draft-mtp'" in log
    completion = _complete(launch)
    assert completion.timings.draft_n is not None
    assert completion.timings.draft_n > 0


def _just_enough(model: ModelFacts, ctx_size: int, headroom_mib: int) -> ModelFacts:
    """``model`` weighing what leaves an RTX 4090 exactly the KV of ``ctx_size`` tokens.

    The fixture weighs half a megabyte; the planner is told it weighs nearly the card, so
    the 4090's VRAM holds the target's context with nothing to spare for a drafter.
    """
    kv = kv_bytes_per_token(layout_from_facts(model)) * ctx_size
    weights = (RTX_4090.vram_mib - headroom_mib) * MIB - kv
    return dataclasses.replace(model, file_size=weights)


def _plan_on_4090(fixture_set: modelgen.FixtureSet, build: BuildUnderTest,
                  target: ModelFacts | None, per_call: dict[str, object]) -> LaunchPlan:
    """The fused-dense bundle planned for an RTX 4090, with ``target`` as the model's facts."""
    bundle = load_bundle(fixture_set.bundle("fused-dense"))
    assert bundle.drafter_path is not None
    return plan_launch(PlanRequest(
        model_path=bundle.text_model, model=target or read_model_facts(bundle.text_model),
        bundle=bundle, drafter_model=read_model_facts(bundle.drafter_path), gpu=RTX_4090,
        configs=load_gpu_configs(), build_key=build.key, per_call=per_call,
        capabilities=build.info.capabilities if build.info else Capabilities(),
        release=build.release))


def test_a_drafter_that_would_cost_the_context_window_is_left_out(
        supervise: Supervise, fixture_set: modelgen.FixtureSet,
        harness_build: BuildUnderTest) -> None:
    ctx = 2048
    per_call: dict[str, object] = {"ctx_size": ctx, "parallel": 1, "cache_type_k": "f16",
                                   "cache_type_v": "f16", "load_mode": "mmap"}
    card = _plan_on_4090(fixture_set, harness_build, None, per_call).tune.config
    assert card is not None, "configs/gpu/rtx-4090.json must match the RTX 4090"
    real = read_model_facts(load_bundle(fixture_set.bundle("fused-dense")).text_model)
    target = _just_enough(real, ctx, card.reserved_headroom_mib)

    plan = _plan_on_4090(fixture_set, harness_build, target, per_call)
    assert plan.drafter.left_out
    assert (plan.spec.drafter, plan.spec.spec_type, plan.spec.ctx_size) == (None, None, ctx)
    reason = next(r for r in plan.reasons if r.startswith("leaving the drafter"))
    assert f"instead of {ctx} tokens" in reason

    # One MiB lighter and the drafter fits beside the full context: it is the drafter's cost.
    roomier = dataclasses.replace(target, file_size=target.file_size - MIB)
    kept = _plan_on_4090(fixture_set, harness_build, roomier, per_call)
    assert not kept.drafter.left_out
    assert kept.spec.drafter is not None

    launch = supervise(plan)
    assert [a.outcome for a in launch.attempts] == [AttemptOutcome.SERVED]
    assert "--spec-draft-model" not in launch.server.argv
    assert _complete(launch).timings.draft_n is None


def test_a_foreign_vocab_drafter_is_dropped_by_the_server_which_serves_without_it(
        fixture_set: modelgen.FixtureSet, supervise: Supervise, plan_for: PlanFor) -> None:
    """What the pinned server really does with a drafter whose vocab differs (measured).

    The drafter-foreign fixture has 309 tokens against the target's 269. The server loads
    it, then ``common_speculative`` refuses it: ``the target and draft vocabs are not
    compatible``, and ``load_model`` logs ``failed to initialize speculative decoding
    context: draft model vocab type must match target model to use speculation`` — both
    at error level — yet the start goes on and the server serves without speculation
    (``timings`` carry no ``draft_n``). It is not a failed start, so the supervisor has
    nothing to retry; a check that wants speculation must read ``draft_n``.
    """
    foreign: Path = fixture_set.model("drafter-foreign")
    plan = plan_for(model="dense")
    spec = dataclasses.replace(plan.spec, ctx_size=512, parallel=1, spec_type="draft-simple",
                               drafter=foreign)
    launch = supervise(dataclasses.replace(plan, spec=spec))
    assert [a.outcome for a in launch.attempts] == [AttemptOutcome.SERVED]
    log = launch.server.log_text()
    assert f"loading draft model '{foreign}'" in log
    assert VOCABS_DIFFER in log
    assert "failed to initialize speculative decoding context" in log
    completion = _complete(launch)
    assert completion.tokens_predicted == 16
    assert completion.timings.draft_n is None
