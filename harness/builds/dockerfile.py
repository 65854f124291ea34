"""A small parser for the harness's Dockerfiles in ``ci/docker/`` (pure: text in, values out).

It reads what the tests and the container build need to know about a Dockerfile without
running Docker: the stages with their ``FROM`` image and ``AS`` name, ``ARG`` names with
their defaults, each ``RUN`` split into simple commands with build args expanded the way
``/bin/sh`` expands them, the CMake configure call with the flags as they reach cmake, and
the targets every ``cmake --build`` builds.

It understands the subset of Dockerfile and shell syntax those files use: line
continuations and comment lines; ``ARG``/``ENV`` scoping per stage (a global ``ARG`` is
seen by ``FROM`` only, and by a stage that declares it again); Docker's own ``$NAME``,
``${NAME}``, ``${NAME:-word}`` and ``${NAME:+word}`` substitution in ``FROM``, ``ARG``,
``ENV`` and ``COPY``; and, in ``RUN``, simple commands joined by ``&&``, ``||``, ``;`` or
``|``, with leading ``NAME=value`` assignments and the shell's quoting and field
splitting of ``$NAME`` / ``${NAME}``. Anything else (``$(…)``, ``${NAME:?…}``, a name no
``ARG`` or ``ENV`` defines) is left as written, so it shows in the result instead of
silently vanishing.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BuildError
from harness.facts.build import Backend
from harness.paths import REPO_ROOT

#: Where the per-backend Dockerfiles live: ``ci/docker/<backend>.Dockerfile``.
DOCKERFILE_DIR = REPO_ROOT / "ci" / "docker"


def dockerfile_path(backend: Backend) -> Path:
    """The Dockerfile that builds llama-server for ``backend`` (the path; nothing is read)."""
    return DOCKERFILE_DIR / f"{backend.value}.Dockerfile"


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
class ShellCommand:
    """One simple command of a ``RUN``, after the shell's expansion of build args."""

    stage: str
    line: int
    #: Leading ``NAME=value`` words: the environment this one command runs with.
    assignments: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]


@dataclass(frozen=True)
class CMakeConfigure:
    """The ``cmake -S … -B …`` call: its arguments as cmake receives them."""

    stage: str
    line: int
    argv: tuple[str, ...]
    assignments: tuple[tuple[str, str], ...]
    source: str | None
    build_dir: str | None
    #: Every ``-D`` flag, written ``-DNAME=VALUE`` also where it was ``-D NAME=VALUE``.
    definitions: tuple[str, ...]
    #: Arguments that are neither ``-S``/``-B`` nor ``-D`` (a generator, a ``-C`` cache…).
    other: tuple[str, ...]


@dataclass(frozen=True)
class CMakeBuild:
    """A ``cmake --build`` call and the targets it names (empty: everything)."""

    stage: str
    line: int
    build_dir: str | None
    targets: tuple[str, ...]
    argv: tuple[str, ...]


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
        calls = [_configure(cmd) for cmd in self.commands(build_args)
                 if _is_cmake(cmd) and _cmake_mode(cmd.argv) == "configure"]
        if len(calls) != 1:
            where = ", ".join(f"line {c.line}" for c in calls) or "none"
            raise BuildError(f"expected exactly one CMake configure call in the Dockerfile, "
                             f"found {len(calls)} ({where})")
        return calls[0]

    def cmake_builds(self, build_args: Mapping[str, str] | None = None) -> tuple[CMakeBuild, ...]:
        """Every ``cmake --build`` call, with the targets it builds."""
        return tuple(_build(cmd) for cmd in self.commands(build_args)
                     if _is_cmake(cmd) and _cmake_mode(cmd.argv) == "build")

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


_SHELL_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_]\w*)\}|(?P<bare>[A-Za-z_]\w*))")
#: Words that open a compound command; the simple command starts after them.
_RESERVED = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done",
                       "while", "until"})
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


def _expand_shell(text: str, env: Mapping[str, str]) -> str:
    """Expand the ``$NAME`` / ``${NAME}`` of ``env`` as ``sh`` does, keeping the text shell.

    Unquoted, the value is field-split on whitespace and each field written back quoted,
    so the later tokenising sees exactly the words the shell would pass on (no globbing:
    the Dockerfiles ``set -f`` before expanding flags). Inside double quotes the value
    stays one word; inside single quotes nothing expands.
    """
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            quote = None if char == "'" else quote
            out.append(char)
            i += 1
            continue
        if char == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if char == '"':
            quote = None if quote == '"' else '"'
        elif char == "'" and quote is None:
            quote = "'"
        elif char == "$":
            match = _SHELL_VAR.match(text, i)
            name = (match.group("braced") or match.group("bare")) if match else None
            if match and name is not None and name in env:
                value = env[name]
                if quote == '"':
                    out.append(value.replace("\\", "\\\\").replace('"', '\\"'))
                else:
                    out.append(" ".join(shlex.quote(field) for field in value.split()))
                i = match.end()
                continue
        out.append(char)
        i += 1
    return "".join(out)


def _run_commands(stage: str, ins: Instruction, env: Mapping[str, str]) -> list[ShellCommand]:
    exec_form = _exec_form(ins.value)
    if exec_form is not None:  # exec form: no shell, no expansion
        return [ShellCommand(stage, ins.line, (), exec_form)] if exec_form else []
    commands: list[ShellCommand] = []
    for segment in _split_commands(ins.value):
        try:
            words = shlex.split(_expand_shell(segment, env))
        except ValueError as error:
            raise BuildError(f"Dockerfile line {ins.line}: {error} in RUN "
                             f"{ins.value!r}") from error
        command = _simple_command(stage, ins.line, words)
        if command is not None:
            commands.append(command)
    return commands


def _split_commands(text: str) -> list[str]:
    """Cut a shell line at its unquoted ``&&``, ``||``, ``;``, ``|`` and ``&`` operators.

    Quotes and ``$(…)`` are respected, so ``tr ';' x`` and ``"$(a; b)"`` stay whole; the
    ``&`` of a redirection such as ``>&2`` is not an operator.
    """
    parts: list[str] = []
    current: list[str] = []
    quote: str | None = None
    depth = 0
    i = 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        elif char == '"':
            quote = None if quote == '"' else '"'
        elif char == "'" and quote is None:
            quote = "'"
        elif quote is None and text.startswith("$(", i):
            depth += 1
        elif quote is None and char == ")" and depth:
            depth -= 1
        elif (quote is None and depth == 0 and char in ";&|"
              and not (char == "&" and i and text[i - 1] in "<>")):
            end = i
            while end < len(text) and text[end] in ";&|":
                end += 1
            parts.append("".join(current))
            current = []
            i = end
            continue
        current.append(char)
        i += 1
    parts.append("".join(current))
    return [part for part in parts if part.strip()]


def _simple_command(stage: str, line: int, words: list[str]) -> ShellCommand | None:
    rest = list(words)
    while rest and rest[0] in _RESERVED:
        rest.pop(0)
    assignments: list[tuple[str, str]] = []
    while rest and _ASSIGNMENT.match(rest[0]):
        name, _, value = rest.pop(0).partition("=")
        assignments.append((name, value))
    if not rest and not assignments:
        return None
    return ShellCommand(stage, line, tuple(assignments), tuple(rest))


def _is_cmake(cmd: ShellCommand) -> bool:
    return bool(cmd.argv) and Path(cmd.argv[0]).name == "cmake"


def _cmake_mode(argv: tuple[str, ...]) -> str:
    options = set(argv[1:])
    if "--build" in options:
        return "build"
    if options & {"--install", "-E", "-P", "--version", "--help"}:
        return "other"
    return "configure"


def _configure(cmd: ShellCommand) -> CMakeConfigure:
    args = list(cmd.argv[1:])
    source = build_dir = None
    definitions: list[str] = []
    other: list[str] = []
    while args:
        word = args.pop(0)
        if word in ("-S", "-B", "-D") and args:
            value = args.pop(0)
            if word == "-D":
                definitions.append(f"-D{value}")
            elif word == "-S":
                source = value
            else:
                build_dir = value
        elif word.startswith("-D") and len(word) > 2:
            definitions.append(word)
        elif word.startswith("-S") and len(word) > 2:
            source = word[2:]
        elif word.startswith("-B") and len(word) > 2:
            build_dir = word[2:]
        else:
            other.append(word)
    return CMakeConfigure(cmd.stage, cmd.line, cmd.argv[1:], cmd.assignments, source,
                          build_dir, tuple(definitions), tuple(other))


def _build(cmd: ShellCommand) -> CMakeBuild:
    args = list(cmd.argv[1:])
    build_dir = None
    targets: list[str] = []
    while args:
        word = args.pop(0)
        if word == "--build" and args:
            build_dir = args.pop(0)
        elif word in ("--target", "-t"):
            # cmake takes every following word up to the next option as a target.
            while args and not args[0].startswith("-"):
                targets.append(args.pop(0))
        elif word.startswith("--target="):
            targets.append(word.removeprefix("--target="))
    return CMakeBuild(cmd.stage, cmd.line, build_dir, tuple(targets), cmd.argv[1:])
