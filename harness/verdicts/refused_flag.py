"""A flag the launch sent and the server refused: a harness bug, not the build's (pure).

Every flag a plan sends is checked against the build's ``--help`` first
(``planning/build_support.py``), and a launch needing one the build lacks is never sent.
So an ``unknown-flag`` start (``error: invalid argument: --x``, ``verdicts/failure.py``)
for a flag the harness itself wrote into the launch (a ``LaunchSpec`` field, not an
``extra_args`` entry a caller added by hand) means the check was wrong or was not made — the
build's help was not read (no capabilities: the plan is trusted), the help lists a flag
the parser refuses, or the launch was not checked at all. The harness is at fault, and
the words below say so, so that the report files it as a harness bug
(``REFUSED_FLAG_PATTERN``, harness/report/allure_meta.py) rather than as the build's.
"""

from __future__ import annotations

import re
from dataclasses import replace

from harness.planning.launch import LaunchSpec
from harness.verdicts.failure import FailureClass, StartFailure

# common/arg.cpp: "error: invalid argument: %s" (older builds: "unknown argument").
_REFUSED = re.compile(r"error: (?:invalid|unknown) argument: (\S+)")
_HEAD = "harness bug: the launch sent "
_TAIL = ", which this build refuses"

#: Finds :func:`refusal_verdict`'s words anywhere in a message (JavaScript and Python
#: regexes read it alike, as the report's categories need).
REFUSED_FLAG_PATTERN = re.escape(_HEAD) + r"\S+" + re.escape(_TAIL)


def refused_flag(failure: StartFailure) -> str | None:
    """The flag an ``unknown-flag`` start names, None for any other failure."""
    if failure.kind is not FailureClass.UNKNOWN_FLAG:
        return None
    found = _REFUSED.search(failure.evidence)
    return found[1].partition("=")[0] if found else None


def refusal_verdict(failure: StartFailure, spec: LaunchSpec) -> str | None:
    """Why a refused flag is the harness's fault, when one of ``spec``'s fields wrote it;
    None when the failure is no refusal or the flag came from ``extra_args``."""
    flag = refused_flag(failure)
    written = replace(spec, extra_args=()).to_argv("llama-server", "127.0.0.1", 0)
    if flag is None or flag not in written:
        return None
    return (f"{_HEAD}{flag}{_TAIL}: every flag a launch sends is checked against the "
            "build's --help first (harness/planning/build_support.py), so either that help "
            "was not read (a build record without capabilities), it lists a flag the "
            "server refuses, or the launch went out unchecked — report it with the build's "
            "--help and this argv")
