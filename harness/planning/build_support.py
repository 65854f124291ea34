"""What a launch sends against what the build under test offers (pure).

A build's ``--help`` (read once, ``harness/builds/capabilities.py``) lists every long
option it accepts, its cache types and its spec types. ``unsupported_features`` holds a
launch's whole argv against it: every long flag, and the values the help enumerates
(``--cache-type-k/-v``, ``--spec-type``). A feature is named the way a user would type it:
``--n-cpu-ffn``, or ``--spec-type draft-mtp`` when the flag is there but not the value.

Where the help is unknown (a binary whose ``--help`` listed none of llama-server's
options, a record without capabilities) the check trusts the launch, as the cache-type
fallback (``capability.py``) does: an empty list is "not known", never "nothing".

The planners that choose a feature avoid what the build lacks where a substitute keeps
the test's meaning (``offload.py``: a plain ``-ngl`` split for ``--n-cpu-ffn``;
``capability.py``: upstream cache types for a fork's). What is left is the plan's
``unsupported``: such a launch is never sent (``LaunchPlan.ensure_sendable``).
"""

from __future__ import annotations

from harness.errors import UnsupportedByBuildError
from harness.facts.build import Capabilities
from harness.planning.capability import not_supported_reason
from harness.planning.launch import LaunchSpec
from harness.planning.offload import OVERRIDE_FLAGS, OffloadKind
from harness.planning.release_rules import release_lacks


def accepts_flag(capabilities: Capabilities, flag: str) -> bool:
    """Whether the build takes ``flag``; True where its help named no flags at all."""
    return not capabilities.flags or capabilities.accepts_flag(flag)


def ensure_offered(capabilities: Capabilities, *flags: str) -> None:
    """Raise ``UnsupportedByBuildError`` naming each of ``flags`` the build lacks.

    For a test whose purpose is a feature the planner would substitute on such a build
    (the dense FFN split): the substitute serves, but it is not what the test is about.
    """
    missing = tuple(flag for flag in flags if not accepts_flag(capabilities, flag))
    if missing:
        raise UnsupportedByBuildError(missing, not_supported_reason(missing))


def ensure_supported(spec: LaunchSpec, capabilities: Capabilities, *,
                     release: int | None = None, architecture: str = "") -> None:
    """Raise ``UnsupportedByBuildError`` when ``spec`` sends a feature the build lacks:
    the last check before a launch goes out, whoever made the spec. ``release`` and the
    model's ``architecture`` add what the build's release lacks for that model though
    its help lists the flag (planning/release_rules.py)."""
    missing = unsupported_features(spec, capabilities) + release_lacks(
        spec.spec_type, architecture, release)
    if missing:
        raise UnsupportedByBuildError(missing, not_supported_reason(missing))


def unavailable_offload_kinds(capabilities: Capabilities) -> frozenset[OffloadKind]:
    """The offload kinds whose switch the build lacks, for the offload planner to avoid."""
    return frozenset(kind for kind, flag in OVERRIDE_FLAGS.items()
                     if not accepts_flag(capabilities, flag))


def unsupported_features(spec: LaunchSpec, capabilities: Capabilities) -> tuple[str, ...]:
    """Every feature ``spec``'s argv sends that the build does not offer, in argv order.

    The whole argv is read, ``extra_args`` too: whoever added a flag, the server refuses
    it the same way. Short flags are not checked (the help's flag list holds the long
    ones, and the launch writes only long ones itself).
    """
    argv = spec.to_argv("llama-server", "127.0.0.1", 0)[1:]
    values = {"--cache-type-k": capabilities.cache_types_k,
              "--cache-type-v": capabilities.cache_types_v,
              "--spec-type": capabilities.spec_types}
    found: list[str] = []
    for index, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        flag, _, inline = arg.partition("=")
        if not accepts_flag(capabilities, flag):
            found.append(flag)
            continue
        accepted = values.get(flag, ())
        value = inline or (argv[index + 1] if index + 1 < len(argv) else "")
        if accepted and value not in accepted:
            found.append(f"{flag} {value}")
    return tuple(dict.fromkeys(found))
