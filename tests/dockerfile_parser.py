"""A small parser for the harness's Dockerfiles in ``ci/docker/`` (pure:
text in, values out).

Used by ``test_dockerfiles.py`` (``from dockerfile_parser import …``; pytest puts
tests/ on the path). It reads what the tests need to know about a Dockerfile without
running Docker: the stages with their ``FROM`` image and ``AS`` name, ``ARG`` names with
their defaults, each ``RUN`` split into simple commands with build args expanded the way
``/bin/sh`` expands them (``shell_commands``), the CMake configure call with the flags as
they reach cmake, and the targets every ``cmake --build`` builds (``cmake_calls``).

It understands the subset of Dockerfile syntax those files use: line continuations and
comment lines; ``ARG``/``ENV`` scoping per stage (a global ``ARG`` is seen by ``FROM``
only, and by a stage that declares it again); and Docker's own ``$NAME``, ``${NAME}``,
``${NAME:-word}`` and ``${NAME:+word}`` substitution in ``FROM``, ``ARG``, ``ENV`` and
``COPY``. A name no ``ARG`` or ``ENV`` defines is left as written in ``RUN``, so it shows
in the result instead of silently vanishing.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from cmake_calls import CMakeBuild, CMakeConfigure, build_calls, configure_calls
from shell_commands import ShellCommand, expand_shell, simple_command, split_commands

from harness.errors import BuildError


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction with its continuation lines joined."""

    keyword: str
    value: str
    #: 1-based line the instruction starts on, for messages.
    line: int


@dataclass(frozen=True)
class Arg:
    """An ``ARG`` declaration; ``default`` is ``None`` when it has none."""

    name: str
    default: str | None


@dataclass(frozen=True)
class Copy:
    """A ``COPY`` or ``ADD``: what it copies, where to, and from which stage or image."""

    keyword: str
    sources: tuple[str, ...]
    destination: str
    from_stage: str | None
    line: int
    #: The label of the stage the instruction is in.
    stage: str


@dataclass(frozen=True)
class Stage:
    """One build stage: its ``FROM`` line and the instructions up to the next ``FROM``."""

    index: int
    #: The image as written after ``FROM``, e.g. ``${BUILD_BASE}``.
    base: str
    name: str | None
    instructions: tuple[Instruction, ...]
    line: int

    @property
    def label(self) -> str:
        """The stage's ``AS`` name, or its index the way Docker numbers unnamed stages."""
        return self.name if self.name is not None else str(self.index)

    @property
    def args(self) -> tuple[Arg, ...]:
        """The ``ARG`` declarations inside this stage, in order."""
        return tuple(arg for ins in self.instructions if ins.keyword == "ARG"
                     for arg in _parse_args(ins))

    @property
    def env_names(self) -> tuple[str, ...]:
        """The names the stage's ``ENV`` instructions set, in order."""
        return tuple(name for ins in self.instructions if ins.keyword == "ENV"
                     for name, _ in _parse_env(ins))

    @property
    def copies(self) -> tuple[Copy, ...]:
        """This stage's ``COPY`` and ``ADD``, with sources and destination as written."""
        return tuple(_parse_copy(ins, self.label) for ins in self.instructions
                     if ins.keyword in ("COPY", "ADD"))

    @property
    def entrypoint(self) -> tuple[str, ...] | None:
        """The last ``ENTRYPOINT``: its exec-form list, or ``/bin/sh -c`` and the text."""
        found: tuple[str, ...] | None = None
        for ins in self.instructions:
            if ins.keyword == "ENTRYPOINT":
                exec_form = _exec_form(ins.value)
                found = exec_form if exec_form is not None else ("/bin/sh", "-c", ins.value)
        return found


@dataclass(frozen=True)
class Dockerfile:
    """A parsed Dockerfile: the global ``ARG``s (before the first ``FROM``) and the stages."""

    global_args: tuple[Arg, ...]
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        """The stage called ``name``; a :class:`BuildError` lists the names there are."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        names = ", ".join(s.label for s in self.stages)
        raise BuildError(f"Dockerfile has no stage named {name!r}; its stages: {names}")

    def arg_defaults(self) -> dict[str, str | None]:
        """The global ``ARG`` names with their defaults as written."""
        return {arg.name: arg.default for arg in self.global_args}

    def base_image(self, stage: Stage, build_args: Mapping[str, str] | None = None) -> str:
        """The image ``stage`` starts from, with global ``ARG``s and ``build_args`` applied."""
        return _substitute(stage.base, self._global_env(build_args or {}))

    def commands(self, build_args: Mapping[str, str] | None = None) -> tuple[ShellCommand, ...]:
        """Every simple command of every ``RUN``, expanded with the env in effect there."""
        given = build_args or {}
        found: list[ShellCommand] = []
        for stage in self.stages:
            for ins, env in self._walk(stage, given):
                if ins.keyword == "RUN":
                    found.extend(_run_commands(stage.label, ins, env))
        return tuple(found)

    def copies(self, build_args: Mapping[str, str] | None = None) -> tuple[Copy, ...]:
        """Every ``COPY``/``ADD`` of every stage, with Docker's substitution applied."""
        given = build_args or {}
        found: list[Copy] = []
        for stage in self.stages:
            for ins, env in self._walk(stage, given):
                if ins.keyword in ("COPY", "ADD"):
                    raw = _parse_copy(ins, stage.label)
                    found.append(Copy(raw.keyword,
                                      tuple(_substitute(src, env) for src in raw.sources),
                                      _substitute(raw.destination, env), raw.from_stage,
                                      raw.line, raw.stage))
        return tuple(found)

    def cmake_configure(self, build_args: Mapping[str, str] | None = None) -> CMakeConfigure:
        """The one CMake configure call; a :class:`BuildError` when there is none or several."""
        calls = configure_calls(self.commands(build_args))
        if len(calls) != 1:
            where = ", ".join(f"line {c.line}" for c in calls) or "none"
            raise BuildError(f"expected exactly one CMake configure call in the Dockerfile, "
                             f"found {len(calls)} ({where})")
        return calls[0]

    def cmake_builds(self, build_args: Mapping[str, str] | None = None) -> tuple[CMakeBuild, ...]:
        """Every ``cmake --build`` call, with the targets it builds."""
        return build_calls(self.commands(build_args))

    def _global_env(self, given: Mapping[str, str]) -> dict[str, str]:
        env: dict[str, str] = {}
        for arg in self.global_args:
            value = _arg_value(arg, given, env, {})
            if value is not None:
                env[arg.name] = value
        return env

    def _walk(self, stage: Stage,
              given: Mapping[str, str]) -> Iterator[tuple[Instruction, dict[str, str]]]:
        # A stage sees a global ARG only once it declares it again (Docker's ARG scope),
        # and ENV values are substituted with what is defined above them.
        global_env = self._global_env(given)
        env: dict[str, str] = {}
        for ins in stage.instructions:
            if ins.keyword == "ARG":
                for arg in _parse_args(ins):
                    value = _arg_value(arg, given, env, global_env)
                    if value is not None:
                        env[arg.name] = value
            elif ins.keyword == "ENV":
                for name, raw in _parse_env(ins):
                    env[name] = _substitute(raw, env)
            yield ins, dict(env)


def parse_dockerfile(text: str) -> Dockerfile:
    """Parse a Dockerfile's text; a :class:`BuildError` names the line it cannot read."""
    global_args: list[Arg] = []
    stages: list[Stage] = []
    current: list[Instruction] = []
    head: tuple[int, str, str | None, int] | None = None

    def close() -> None:
        if head is not None:
            index, base, name, line = head
            stages.append(Stage(index, base, name, tuple(current), line))

    for ins in _instructions(text):
        if ins.keyword == "FROM":
            close()
            base, name = _parse_from(ins)
            head = (len(stages), base, name, ins.line)
            current = []
        elif head is None:
            if ins.keyword != "ARG":
                raise BuildError(f"Dockerfile line {ins.line}: {ins.keyword} before the first "
                                 "FROM (only ARG may come first)")
            global_args.extend(_parse_args(ins))
        else:
            current.append(ins)
    close()
    if not stages:
        raise BuildError("Dockerfile has no FROM instruction")
    return Dockerfile(tuple(global_args), tuple(stages))


def _instructions(text: str) -> Iterator[Instruction]:
    # Docker drops comment lines (and blank lines) even inside a continuation, and joins a
    # line ending in the escape character (the default, a backslash) with the next.
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
        body = raw.rstrip()
        if body.endswith("\\"):
            pending.append(body[:-1])
            continue
        pending.append(body)
        yield _instruction(" ".join(part.strip() for part in pending), start)
        pending = []
    if pending:
        yield _instruction(" ".join(part.strip() for part in pending), start)


def _instruction(line: str, number: int) -> Instruction:
    keyword, _, rest = line.partition(" ")
    if not re.fullmatch(r"[A-Za-z]+", keyword):
        raise BuildError(f"Dockerfile line {number}: cannot read {line[:60]!r}")
    return Instruction(keyword.upper(), rest.strip(), number)


def _parse_from(ins: Instruction) -> tuple[str, str | None]:
    words = [w for w in ins.value.split() if not w.startswith("--")]  # --platform=…
    if len(words) == 1:
        return words[0], None
    if len(words) == 3 and words[1].lower() == "as":
        return words[0], words[2]
    raise BuildError(f"Dockerfile line {ins.line}: cannot read FROM {ins.value!r}")


def _parse_args(ins: Instruction) -> list[Arg]:
    args = []
    for word in _words(ins):
        name, eq, default = word.partition("=")
        args.append(Arg(name, default if eq else None))
    return args


def _parse_env(ins: Instruction) -> list[tuple[str, str]]:
    words = _words(ins)
    if words and "=" not in words[0]:
        # The legacy form ``ENV NAME value with spaces``.
        return [(words[0], ins.value.split(None, 1)[1] if len(words) > 1 else "")]
    return [(name, value) for name, _, value in (w.partition("=") for w in words)]


def _parse_copy(ins: Instruction, stage: str) -> Copy:
    exec_form = _exec_form(ins.value)
    words = list(exec_form) if exec_form is not None else ins.value.split()
    from_stage = None
    while words and words[0].startswith("--"):
        flag = words.pop(0)
        if flag.startswith("--from="):
            from_stage = flag.removeprefix("--from=")
    if len(words) < 2:
        raise BuildError(f"Dockerfile line {ins.line}: {ins.keyword} needs a source and a "
                         "destination")
    return Copy(ins.keyword, tuple(words[:-1]), words[-1], from_stage, ins.line, stage)


def _words(ins: Instruction) -> list[str]:
    try:
        return shlex.split(ins.value)
    except ValueError as error:
        raise BuildError(f"Dockerfile line {ins.line}: {error} in {ins.value!r}") from error


def _exec_form(value: str) -> tuple[str, ...] | None:
    if not value.startswith("["):
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return None  # Docker too falls back to the shell form for a malformed list.
    if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
        return tuple(parsed)
    return None


def _arg_value(arg: Arg, given: Mapping[str, str], env: Mapping[str, str],
               global_env: Mapping[str, str]) -> str | None:
    if arg.name in given:
        return given[arg.name]
    if arg.default is not None:
        return _substitute(arg.default, env)
    return global_env.get(arg.name)


#: Docker's own substitution (FROM, ARG, ENV, COPY, WORKDIR…), not the shell's.
_DOCKER_VAR = re.compile(
    r"\\\$|\$\{(?P<braced>[A-Za-z_]\w*)(?::(?P<op>[-+])(?P<word>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_]\w*)"
)


def _substitute(text: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "\\$":
            return "$"
        name = match.group("braced") or match.group("bare")
        value = env.get(name)
        op = match.group("op")
        if op == "-":
            return value if value else match.group("word")
        if op == "+":
            return match.group("word") if value else ""
        return value or ""  # Docker expands an unset name to nothing.

    return _DOCKER_VAR.sub(replace, text)


def _run_commands(stage: str, ins: Instruction, env: Mapping[str, str]) -> list[ShellCommand]:
    exec_form = _exec_form(ins.value)
    if exec_form is not None:  # exec form: no shell, no expansion
        return [ShellCommand(stage, ins.line, (), exec_form)] if exec_form else []
    commands: list[ShellCommand] = []
    for segment in split_commands(ins.value):
        try:
            words = shlex.split(expand_shell(segment, env))
        except ValueError as error:
            raise BuildError(f"Dockerfile line {ins.line}: {error} in RUN "
                             f"{ins.value!r}") from error
        command = simple_command(stage, ins.line, words)
        if command is not None:
            commands.append(command)
    return commands
