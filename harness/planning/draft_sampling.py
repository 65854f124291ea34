"""Where a launch sends ``--spec-draft-sampling`` (pure).

The runtime in docs/references.md (reference 002) passes the draft sampling only to the
speculative types whose drafters honour it — MTP, simple and DFlash: in the pinned source
the draft-* implementations of common/speculative.cpp read ``params.probabilistic`` — and
leaves llama.cpp's greedy default alone otherwise. A build older than the option knows
only greedy drafting, so a greedy request to it is left out rather than refused; a
probabilistic one stays and the plan reports it as not supported by that build.
"""

from __future__ import annotations

from harness.facts.build import Capabilities
from harness.facts.gpu import DraftSampling
from harness.planning.build_support import accepts_flag

SAMPLING_FLAG = "--spec-draft-sampling"
#: The spec types whose drafters honour the draft sampling.
SAMPLING_SPEC_TYPES = frozenset({"draft-mtp", "draft-simple", "draft-dflash"})


def sampling_left_out(sampling: DraftSampling | None, spec_type: str | None,
                      capabilities: Capabilities) -> str | None:
    """Why the planned ``sampling`` is not sent with ``spec_type``; None when it is
    sent (or none is planned)."""
    if sampling is None:
        return None
    if not set(str(spec_type or "none").split(",")) & SAMPLING_SPEC_TYPES:
        return (f"{SAMPLING_FLAG} {sampling} left out: spec type {spec_type or 'none'} "
                "has no drafter that samples its drafts")
    if sampling is DraftSampling.GREEDY and not accepts_flag(capabilities, SAMPLING_FLAG):
        return (f"{SAMPLING_FLAG} greedy left out: the build has no {SAMPLING_FLAG}, and "
                "greedy drafting is all it does")
    return None
