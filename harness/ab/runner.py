"""Running an A/B comparison: fresh servers of both builds, block after block (the I/O).

Each start is one sample of every figure the run record measures for a server:
``load_s`` (launch to ready), then ``ttft_ms``, ``prompt_tps`` and ``decode_tps`` as
:func:`harness.perf.measure.measure_speed` takes them for every suite server, and the
deterministic counters (startup log, one greedy completion). Both arms get the same
launch spec — model, context, threads — so the build is the only difference
(``harness tune`` instead gives each arm its own spec on one binary).

After each block every metric still undecided is decided on the pairs so far; a
metric's first decisive verdict is final (the sequential stop). The comparison ends
when every metric is decided, or when the next block would not fit in the budget —
unless a metric's interval lies wholly beyond "no change" but straddles the threshold
(:func:`harness.ab.decision.worth_extending`): then it goes on, up to the rule's
``extend_s`` past the budget. What is undecided at the end is ``unknown``.

The module stays whole because it is one job, starting servers for a comparison: the
probe start that sizes the first-token prompt, the blocks and a continued comparison
all go through the one ``_Starter`` and its measure.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import httpx

from harness.ab.counters import read_counters
from harness.ab.covariate import (
    BOTH_COVARIATES,
    MACHINE_COVARIATE,
    NO_COVARIATE,
    covariates_for,
)
from harness.ab.decision import (
    AbRule,
    AbVerdict,
    MetricDecision,
    decide_metric,
    worth_extending,
)
from harness.ab.design import (
    BASELINE,
    CANDIDATE,
    HALVED,
    SEQUENTIAL,
    Block,
    Sample,
    Slot,
    paired_values,
    plan_block,
)
from harness.ab.first_token import LONGEST_PROMPT, first_token_prompt, wanted_first_token_ms
from harness.ab.machine_speed import machine_speed
from harness.ab.pinning import client_pinned, core_halves, pin_process, usable_cores
from harness.ab.sampling import PROBE_REPETITIONS, plan_sampling
from harness.ab.validation import earn_unchanged, validated_metrics
from harness.client import ServerClient, shared_pool
from harness.errors import ConfigError, ServerApiError, ServerError, ServerExitedError
from harness.facts.build import Backend
from harness.numerics.fingerprint import TOP_N as FINGERPRINT_TOP_N
from harness.numerics.fingerprint import (
    Fingerprint,
    NumericsComparison,
    NumericsVerdict,
    compare_fingerprints,
    fingerprint_of,
)
from harness.numerics.token_bytes import read_token_bytes
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS
from harness.perf.measure import SpeedSample, measure_speeds, prompt_ids
from harness.planning.launch import LaunchSpec
from harness.results.run_record import METRICS
from harness.runners.base import RunningServer, ServerRunner
from harness.runners.container_runner import ContainerRunner
from harness.runners.launching import until_ready
from harness.runners.readiness import describe_failure
from harness.runners.subprocess_runner import SubprocessRunner

#: What ``harness ab`` measures unless told otherwise, in the order it prints them.
AB_METRICS = ("decode_tps", "prompt_tps", "ttft_ms", "load_s")
CONTEXT_STEP = 512
#: The covariates that read the machine's speed around each start.
MACHINE_READ = (MACHINE_COVARIATE, BOTH_COVARIATES)
#: The label (and log folder) of the baseline's one unpaired start that sizes the
#: first-token prompt.
PROBE = "probe"
#: How long a server that dropped a request may take to be seen exiting.
EXIT_GRACE_S = 2.0
#: Tokens of the greedy completion whose text is a deterministic counter and whose
#: log-probabilities are the numerics fingerprint.
GREEDY_TOKENS = 16


@dataclass(frozen=True)
class Measured:
    """What one server start gives: its figures, its deterministic counters, its numbers,
    and each counted completion's decode speed (what a probe sizes the sampling from)."""

    values: dict[str, float]
    counters: dict[str, str]
    fingerprint: Fingerprint | None
    decode_each: tuple[float, ...] = ()
    #: The machine's speed on the server's cores around its timed completions (None:
    #: not read; harness/ab/machine_speed.py).
    machine: float | None = None


@dataclass(frozen=True)
class Arm:
    """One side of the comparison: a binary (started as a child) or an image."""

    label: str
    binary: Path | None = None
    image: str | None = None
    #: The build's backend where its record says (a bare image name does not).
    backend: Backend | None = None
    #: The whole launch of this arm's servers (``harness tune``: the same binary, other
    #: settings); its unset ``threads`` get the comparison's. None: the spec every arm
    #: shares (the settings' model, context and threads), so the build is the difference.
    spec: LaunchSpec | None = None

    def describe(self) -> str:
        return str(self.binary) if self.binary is not None else f"image {self.image}"


def context_for(n_prompt: int, n_gen: int) -> int:
    """The context every server gets: room for one request's prompt and generation,
    in steps of 512 tokens (pure)."""
    return CONTEXT_STEP * max(1, math.ceil((n_prompt + n_gen) / CONTEXT_STEP))


@dataclass(frozen=True)
class AbSettings:
    model: Path
    fixture: str
    metrics: tuple[str, ...] = AB_METRICS
    rule: AbRule = field(default_factory=AbRule)
    design: str = SEQUENTIAL
    #: None: the smallest multiple of 512 that holds the prompt and the generation.
    ctx_size: int | None = None
    #: ``--threads`` of every server; None: all cores (interleaved), half (duet,
    #: sequential).
    threads: int | None = None
    n_prompt: int = DEFAULT_PROMPT_TOKENS
    #: Prompt tokens of the first-token requests. None: as long as ``ttft_ms``'s floor
    #: needs, sized by one probe start of the baseline (harness/ab/first_token.py) when
    #: ``ttft_ms`` is measured, else ``n_prompt``.
    ttft_prompt: int | None = None
    #: Decode tokens per timed completion. None: sized to the noise by the probe start
    #: (harness/ab/sampling.py).
    n_gen: int | None = DEFAULT_GEN_TOKENS
    repetitions: int = DEFAULT_REPETITIONS
    #: Completions each start runs before its timed ones, not counted. None: as many as
    #: the probe start shows to be warm-up.
    warmup: int | None = 0
    #: Pin this process (the client timing the servers) to the other half of the cores
    #: while a pair's servers are measured on their half (sequential, alternating), so
    #: the client's own work does not share the measured servers' cores.
    pin_client: bool = False
    #: The covariate the intervals are adjusted by (harness/ab/covariate.py).
    covariate: str = NO_COVARIATE
    seed: int | None = None
    #: The metrics whose "unchanged" this design has earned on this host
    #: (harness/ab/validation.py); None: sequential every metric, any other design none.
    validated: frozenset[str] | None = None

    def context(self) -> int:
        return self.ctx_size or context_for(max(self.n_prompt, self.first_prompt()),
                                            self.gen_tokens())

    def gen_tokens(self) -> int:
        """Decode tokens per timed completion (the default until a probe sized them)."""
        return self.n_gen if self.n_gen is not None else DEFAULT_GEN_TOKENS

    def sized(self) -> bool:
        """Whether nothing is left for a probe start to size."""
        return self.n_gen is not None and self.warmup is not None and (
            self.ttft_prompt is not None or "ttft_ms" not in self.metrics)

    def first_prompt(self) -> int:
        """Prompt tokens the first-token requests send."""
        return self.ttft_prompt if self.ttft_prompt is not None else self.n_prompt

    def earned(self) -> frozenset[str]:
        if self.validated is not None:
            return self.validated
        return validated_metrics(self.design, self.metrics, None)


@dataclass
class AbProgress:
    """What is known after a block: the samples, and each metric's decision so far."""

    samples: list[Sample]
    decisions: dict[str, MetricDecision]
    #: Seconds from the start to each metric's decisive verdict.
    decided_after_s: dict[str, float]
    elapsed_s: float
    blocks: int


@dataclass(frozen=True)
class AbOutcome:
    baseline: Arm
    candidate: Arm
    settings: AbSettings
    seed: int
    samples: tuple[Sample, ...]
    decisions: tuple[MetricDecision, ...]
    decided_after_s: dict[str, float]
    elapsed_s: float
    blocks: int
    #: The log files of every server, in start order, for a look when a verdict surprises.
    log_dir: Path | None = None
    #: Seconds measured past the budget because a metric was worth it (0: none), and
    #: which metrics asked for it.
    extended_s: float = 0.0
    extended_for: tuple[str, ...] = ()

    @property
    def regressed(self) -> bool:
        return any(d.verdict is AbVerdict.REGRESSED for d in self.decisions)

    @cached_property
    def numerics(self) -> NumericsComparison:
        """The candidate's numbers against the baseline's (``harness.numerics.fingerprint``):
        worked out once, read by the table, the JSON, the record and the exit code."""
        def prints(arm: str) -> list[Fingerprint]:
            return [s.fingerprint for s in self.samples
                    if s.arm == arm and s.fingerprint is not None]
        return compare_fingerprints(prints(BASELINE), prints(CANDIDATE))

    @property
    def failed(self) -> bool:
        """What ``harness ab`` exits 1 for: a metric regressed, or the numbers changed."""
        return self.regressed or self.numerics.verdict is NumericsVerdict.CHANGED


def _check(baseline: Arm, candidate: Arm, settings: AbSettings,
           resume: AbOutcome | None = None) -> None:
    def same(a: Arm, b: Arm, c: AbSettings) -> tuple[object, ...]:
        return replace(a, label=""), replace(b, label=""), c.design, c.metrics, c.model
    if resume is not None and same(resume.baseline, resume.candidate, resume.settings) \
            != same(baseline, candidate, settings):
        raise ValueError("a comparison continues only with its own arms, design, metrics "
                         "and model")
    try:
        # The design's own check, run on a throwaway block before any server starts.
        plan_block(settings.design, 0, random.Random(0), settings.rule.block_size)
    except ValueError as exc:
        raise ConfigError(f"A/B settings: block size {settings.rule.block_size}: {exc}") \
            from exc
    design = settings.design
    if design in HALVED and (baseline.binary is None or candidate.binary is None):
        raise ConfigError(f"the {design} design pins each server to half of the cores, "
                          "which needs host processes: give binaries or builds, or use "
                          "--design interleaved for images")
    if design in HALVED and len(usable_cores()) < 2:
        raise ConfigError(f"the {design} design needs at least two cores (it pins to "
                          "halves); use --design interleaved")


class _Starter:
    """Starts and measures one server of an arm; owns the arm's runner."""

    def __init__(self, arm: Arm, settings: AbSettings, log_dir: Path, threads: int,
                 env: dict[str, str] | None) -> None:
        self._arm = arm
        self._settings = settings
        self._spec = (LaunchSpec(model=settings.model, ctx_size=settings.context(),
                                 threads=threads) if arm.spec is None
                      else replace(arm.spec, threads=arm.spec.threads or threads))
        self._runner: ServerRunner[RunningServer]
        if arm.binary is not None:
            self._runner = SubprocessRunner(arm.binary, log_dir / arm.label, env=env)
        else:
            assert arm.image is not None
            self._runner = ContainerRunner(arm.image, log_dir / arm.label, env=env)

    def measure(self, cpus: set[int] | None, client_cpus: set[int] | None = None, *,
                read_machine: bool = True) -> Measured:
        """One fresh server on ``cpus`` (None: unpinned), measured with this process on
        ``client_cpus`` (None: where it is) while it is measured."""
        with client_pinned(client_cpus):
            return _measure_together([self], cpus, read_machine=read_machine)[0]

    def launch(self, cpus: set[int] | None) -> _Started:
        """A fresh server of the arm, pinned to ``cpus`` before its model loads."""
        launched = time.monotonic()
        server = self._runner.launch(self._spec)
        try:
            # Pinned before the wait, so the model loads on the arm's cores too.
            pid = server.host_pid() if cpus is not None else None
            if cpus is not None and pid is not None:
                pin_process(pid, cpus)
        except BaseException:
            server.stop()
            raise
        return _Started(self, server, pid, launched)

    def finish(self, started: _Started, speed: SpeedSample,
               machine: float | None) -> Measured:
        """The start's figures, counters and numbers, once its timed requests are done."""
        values = {"load_s": started.load_s}
        for name, value in (("ttft_ms", speed.ttft_ms), ("prompt_tps", speed.prompt_tps),
                            ("decode_tps", speed.decode_tps)):
            if value is not None:
                values[name] = value
        server = started.server
        try:
            # The model's token bytes say which greedy tokens the server reports.
            token_bytes = _token_bytes(self._settings.model)
            greedy = _greedy(server.base_url, token_bytes)
        except (httpx.TransportError, ServerApiError) as exc:
            raise _lost(server, self._arm, exc) from exc
        counters = read_counters(server.log_text(), greedy)
        fingerprint = fingerprint_of(greedy, len(token_bytes), token_bytes)
        return Measured(values, counters, fingerprint, speed.decode_each, machine)


@dataclass
class _Started:
    """A server launched for a start: whose it is, and when it was launched."""

    starter: _Starter
    server: RunningServer
    pid: int | None
    launched: float
    load_s: float = 0.0


def _measure_together(starters: Sequence[_Starter], cpus: set[int] | None, *,
                      read_machine: bool = True) -> list[Measured]:
    """One fresh server per starter on ``cpus``, measured in turns (one starter: alone).

    Every server is launched, then each waited for (its ``load_s``: launch to ready) and
    pinned again (the threads its model load made), then their timed requests alternate
    (:func:`harness.perf.measure.measure_speeds`) with the machine's speed read around
    them where the covariate asks (and ``read_machine``: duet measures its two arms in
    two threads of this process at once, whose loops would share one interpreter, so it
    reads none and its comparisons are not adjusted by the machine); each is stopped
    whatever happens.
    """
    settings = starters[0]._settings
    started: list[_Started] = []
    try:
        for starter in starters:
            started.append(starter.launch(cpus))
        for one in started:
            until_ready(one.starter._runner, one.server)
            one.load_s = time.monotonic() - one.launched
            if cpus is not None and one.pid is not None:
                pin_process(one.pid, cpus)
        # Read just before and just after the timed completions, on the servers'
        # cores: the moment of the machine they ran in.
        reads = read_machine and settings.covariate in MACHINE_READ
        before = machine_speed(cpus) if reads else None
        try:
            speeds = measure_speeds([one.server.base_url for one in started],
                                    settings.n_prompt, settings.gen_tokens(),
                                    settings.repetitions,
                                    first_token_prompt=settings.first_prompt(),
                                    warmup=settings.warmup or 0)
        except (httpx.TransportError, ServerApiError) as exc:
            failed = next((one for one in started if one.server.exit_code() is not None),
                          started[0])
            raise _lost(failed.server, failed.starter._arm, exc) from exc
        machine = math.sqrt(before * machine_speed(cpus)) if before is not None else None
        return [one.starter.finish(one, speed, machine)
                for one, speed in zip(started, speeds, strict=True)]
    finally:
        for one in started:
            one.server.stop()


def _lost(server: RunningServer, arm: Arm, exc: Exception) -> ServerError:
    """The error for a server that dropped or refused a request while it was measured:
    whether it exited (and how), its argv and its last log lines, before ``stop`` loses
    them."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while server.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # a crash closes the socket a moment before the process is reaped
    code = server.exit_code()
    what = "exited" if code is not None else "failed a request"
    text = describe_failure(
        server, f"the {arm.label} server ({arm.describe()}) {what} while it was measured: "
                f"{exc}",
        hint="the server's own error, if it printed one, is in the log lines above; "
             "`harness ab --log-dir DIR` keeps every server's whole log")
    return ServerExitedError(text) if code is not None else ServerError(text)


@cache
def _token_bytes(model: Path) -> tuple[bytes, ...]:
    return read_token_bytes(model)


def _greedy(base_url: str, token_bytes: Sequence[bytes]) -> dict[str, Any]:
    with ServerClient(base_url, http=shared_pool()) as client:
        return client.completion(prompt_ids(16), n_predict=GREEDY_TOKENS, temperature=0.0,
                                 seed=0, n_probs=min(FINGERPRINT_TOP_N, len(token_bytes)),
                                 return_tokens=True).raw


def _threads(settings: AbSettings) -> int:
    if settings.threads is not None:
        return settings.threads
    cores = len(usable_cores())
    return max(1, cores // 2) if settings.design in HALVED else cores


def run_ab(baseline: Arm, candidate: Arm, settings: AbSettings, *,
           env: dict[str, dict[str, str]] | None = None,
           on_block: Callable[[AbProgress], None] | None = None,
           log_dir: Path | None = None, resume: AbOutcome | None = None) -> AbOutcome:
    """Compare ``candidate`` with ``baseline`` until decided or out of budget.

    ``env``: per arm label (``baseline``/``candidate``), the environment its servers
    get (None: this process's). Servers' logs go under ``log_dir`` (a temporary folder,
    removed afterwards, when None). ``resume``: an earlier comparison of the same arms,
    continued: its pairs count, its first-token prompt holds, its seconds count against
    ``settings``' budget (the total), new blocks are numbered after its own.
    """
    _check(baseline, candidate, settings, resume)
    if resume is not None:
        # What the first comparison's probe sized holds for its continuation.
        settings = replace(settings, ttft_prompt=resume.settings.ttft_prompt,
                           n_gen=resume.settings.n_gen, warmup=resume.settings.warmup)
    if log_dir is not None:
        return _run(baseline, candidate, settings, env=env or {}, on_block=on_block,
                    log_dir=log_dir, resume=resume)
    with tempfile.TemporaryDirectory(prefix="harness-ab-") as temp:
        outcome = _run(baseline, candidate, settings, env=env or {}, on_block=on_block,
                       log_dir=Path(temp), resume=resume)
    return replace(outcome, log_dir=None)


def _run(baseline: Arm, candidate: Arm, settings: AbSettings, *,
         env: dict[str, dict[str, str]], on_block: Callable[[AbProgress], None] | None,
         log_dir: Path, resume: AbOutcome | None = None) -> AbOutcome:
    seed = settings.seed if settings.seed is not None else random.SystemRandom().randrange(
        2**32)
    # A continued comparison draws its blocks' orders afresh: the same seed would
    # repeat the first blocks' coin flips.
    rng = random.Random(seed if resume is None else f"{seed}+{resume.blocks}")
    threads = _threads(settings)
    # The budget counts the probe start too, and a resumed comparison's seconds.
    started = time.monotonic() - (resume.elapsed_s if resume is not None else 0.0)
    settings = _with_probed_settings(settings, baseline, log_dir, threads,
                                     env.get(BASELINE))
    starters = {arm.label: _Starter(arm, settings, log_dir, threads, env.get(arm.label))
                for arm in (replace(baseline, label=BASELINE),
                            replace(candidate, label=CANDIDATE))}
    samples: list[Sample] = list(resume.samples) if resume is not None else []
    frozen: dict[str, MetricDecision] = {}
    decided_after: dict[str, float] = {}
    block_times: list[float] = []
    number = resume.blocks if resume is not None else 0
    current: dict[str, MetricDecision] = {}
    extended_for: set[str] = set()
    while True:
        block = plan_block(settings.design, number, rng, settings.rule.block_size)
        block_started = time.monotonic()
        samples += _run_block(block, starters, started, len(samples),
                              pin_client=settings.pin_client)
        block_times.append(time.monotonic() - block_started)
        elapsed = time.monotonic() - started
        for metric in settings.metrics:
            if metric in frozen:
                continue
            decision = decide_metric(metric, *paired_values(samples, metric), settings.rule,
                                     _covariate(settings, samples, metric))
            # An unearned "unchanged" is unknown: not final, so measuring goes on and a
            # real change the design compresses can still show as regressed.
            decision = earn_unchanged(decision, settings.design, settings.earned())
            current[metric] = decision
            if decision.final:
                frozen[metric] = decision
                decided_after[metric] = elapsed
        number += 1
        decisions = {metric: frozen.get(metric, current[metric]) for metric in settings.metrics}
        if on_block is not None:
            on_block(AbProgress(samples, decisions, dict(decided_after), elapsed, number))
        # Stop when decided, or when another block (as long as the slowest so far) would
        # end past the budget.
        if len(frozen) == len(settings.metrics):
            break
        next_end = elapsed + max(block_times)
        if next_end > settings.rule.budget_s:
            # Past the budget only while a shown change is still sized against the
            # threshold, and only up to the extension's ceiling.
            asking = [m for m, d in decisions.items() if worth_extending(d)]
            if not asking or next_end > settings.rule.budget_s + settings.rule.extend_s:
                break
            extended_for.update(asking)
    elapsed = time.monotonic() - started
    return AbOutcome(baseline=baseline, candidate=candidate, settings=settings, seed=seed,
                     samples=tuple(samples),
                     decisions=tuple(decisions[m] for m in settings.metrics),
                     decided_after_s=decided_after, elapsed_s=elapsed,
                     blocks=number, log_dir=log_dir,
                     extended_s=max(0.0, elapsed - settings.rule.budget_s)
                     if extended_for else 0.0,
                     extended_for=tuple(m for m in settings.metrics if m in extended_for))


def _covariate(settings: AbSettings, samples: Sequence[Sample],
               metric: str) -> list[list[float]] | None:
    return covariates_for(settings.covariate, samples, metric)


def _with_probed_settings(settings: AbSettings, baseline: Arm, log_dir: Path,
                          threads: int, env: dict[str, str] | None) -> AbSettings:
    """``settings`` with what a probe sizes fixed: the first-token prompt, the decode
    tokens and the warm-up, each as given or sized from unpaired starts of the baseline
    (on the first half of the cores where the design pins): one start that times more
    completions than a compared one at the default length (harness/ab/sampling.py), and
    where ``ttft_ms`` needs a longer first-token prompt, a start per length tried."""
    if settings.sized():
        return settings
    cpus = core_halves()[0] if settings.design in HALVED else None
    client = core_halves()[1] if cpus is not None and settings.pin_client else None
    arm = replace(baseline, label=PROBE)
    sampling = settings.n_gen is None or settings.warmup is None
    probe = replace(settings, n_gen=settings.gen_tokens(), warmup=0,
                    repetitions=PROBE_REPETITIONS if sampling else settings.repetitions)
    measured = _Starter(arm, probe, log_dir, threads, env).measure(cpus, client)
    if sampling:
        plan = plan_sampling(measured.decode_each, tokens=probe.gen_tokens(),
                             repetitions=settings.repetitions,
                             threshold=settings.rule.threshold,
                             size_tokens=settings.n_gen is None,
                             size_warmup=settings.warmup is None)
        settings = replace(settings, n_gen=plan.gen_tokens, warmup=plan.warmup)
    if settings.ttft_prompt is not None or "ttft_ms" not in settings.metrics:
        return settings
    floor, threshold = METRICS["ttft_ms"].min_change, settings.rule.threshold
    values = measured.values
    chosen = first_token_prompt(settings.n_prompt, values.get("ttft_ms"),
                                values.get("prompt_tps"), floor_ms=floor, threshold=threshold)
    # The choice is a prediction from the short prompt, off by half either way between
    # starts here: a lengthened prompt is measured once and doubled while its first token
    # is still short of what the floor needs.
    while settings.n_prompt < chosen < LONGEST_PROMPT:
        at_choice = replace(settings, ttft_prompt=chosen)
        ttft = _Starter(arm, at_choice, log_dir, threads, env).measure(
            cpus, client).values.get("ttft_ms")
        if ttft is None or ttft >= wanted_first_token_ms(floor, threshold):
            break
        chosen *= 2
    return replace(settings, ttft_prompt=min(chosen, LONGEST_PROMPT))


def _run_block(block: Block, starters: dict[str, _Starter], started: float,
               sequence: int, *, pin_client: bool = False) -> list[Sample]:
    halves = core_halves()
    if block.coresident:
        return _run_coresident(block, starters, started, sequence, pin_client=pin_client)
    if not block.together:
        # One start after another, each alone on the machine (sequential: on its pair's
        # half of the cores, the client on the other half where asked; interleaved: on
        # all of them).
        found = []
        for offset, slot in enumerate(block.slots):
            at = time.monotonic() - started
            cpus = halves[slot.half] if slot.half is not None else None
            client = halves[1 - slot.half] if slot.half is not None and pin_client else None
            found.append(_sample(slot, block, sequence=sequence + offset, at=at,
                                 measured=starters[slot.arm].measure(cpus, client)))
        return found
    found = []
    pairs = sorted({slot.pair for slot in block.slots})
    for pair in pairs:
        slots = [slot for slot in block.slots if slot.pair == pair]
        at = time.monotonic() - started
        # Both arms at once: a barrier would not help (start-up takes a different time
        # per build); each measures its own server on its own cores in the same seconds.
        with ThreadPoolExecutor(max_workers=len(slots)) as pool:
            futures = [pool.submit(starters[slot.arm].measure,
                                   halves[slot.half] if slot.half is not None else None,
                                   read_machine=False)
                       for slot in slots]
            results = [future.result() for future in futures]
        found += [_sample(slot, block, sequence=sequence + len(found) + offset, at=at,
                          measured=measured)
                  for offset, (slot, measured) in enumerate(zip(slots, results, strict=True))]
    return found


def _run_coresident(block: Block, starters: dict[str, _Starter], started: float,
                    sequence: int, *, pin_client: bool) -> list[Sample]:
    """Alternating: each pair's two servers at once on the pair's half, measured in turns
    (the pair's first slot first), the client on the other half where asked."""
    halves = core_halves()
    found: list[Sample] = []
    for pair in sorted({slot.pair for slot in block.slots}):
        slots = [slot for slot in block.slots if slot.pair == pair]
        half = slots[0].half
        cpus = halves[half] if half is not None else None
        client = halves[1 - half] if half is not None and pin_client else None
        at = time.monotonic() - started
        with client_pinned(client):
            measured = _measure_together([starters[slot.arm] for slot in slots], cpus)
        found += [_sample(slot, block, sequence=sequence + len(found) + offset, at=at,
                          measured=one)
                  for offset, (slot, one) in enumerate(zip(slots, measured, strict=True))]
    return found


def _sample(slot: Slot, block: Block, *, sequence: int, at: float,
            measured: Measured) -> Sample:
    return Sample(arm=slot.arm, pair=slot.pair, block=block.number, sequence=sequence,
                  at_s=at, values=measured.values, counters=measured.counters,
                  half=slot.half, fingerprint=measured.fingerprint,
                  machine=measured.machine)

