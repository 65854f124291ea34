"""Measures a running llama-server: speed from its timings, memory from the kernel.

Speeds come from the server's own ``timings`` (prompt and decode tokens per second) on
a fixed token-id prompt, so every fixture gets exactly the prompt length its key says,
whatever its vocabulary. Time to first token is the client's clock on a streamed
completion. Peak host memory is the process's ``VmHWM``; VRAM is read through NVML,
else AMD SMI, where one is installed and answers (the figure is left out otherwise,
never guessed).

A measurement has a deadline as a whole (``MEASURE_BUDGET_S``) as well as per request:
it runs just before a server is stopped, inside the test's own time, so a server that
has started to hang costs one bounded measurement, not the test's pytest-timeout.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pynvml

from harness.client import ServerClient, shared_pool
from harness.errors import ServerApiError
from harness.verdicts.kv_log import parse_kv_cache_lines

#: Token ids 3.. avoid the unknown/BOS/EOS ids (0-2) every fixture vocabulary starts with.
_FIRST_ORDINARY_ID = 3
_ID_SPREAD = 200
FIRST_TOKEN_SAMPLES = 3
#: Seconds one request of a measurement may take.
REQUEST_TIMEOUT_S = 60.0
#: Seconds a whole measurement may take: a few seconds on the fixtures, tens on a large
#: model; what it is there to catch is a server that has started to hang.
MEASURE_BUDGET_S = 180.0


@dataclass(frozen=True)
class SpeedSample:
    ttft_ms: float | None
    prompt_tps: float | None
    decode_tps: float | None
    #: Each counted completion's decode speed, in the order run (the median's inputs).
    decode_each: tuple[float, ...] = ()


def prompt_ids(n_tokens: int) -> list[int]:
    """A deterministic prompt of exactly ``n_tokens`` ordinary token ids."""
    return [_FIRST_ORDINARY_ID + (i * 7) % _ID_SPREAD for i in range(n_tokens)]


def measure_speed(base_url: str, n_prompt: int, n_gen: int, repetitions: int,
                  timeout_s: float = REQUEST_TIMEOUT_S, *,
                  budget_s: float | None = None,
                  first_token_prompt: int | None = None, warmup: int = 0) -> SpeedSample:
    """Streamed completions for time to first token, then ``repetitions`` timed ones.

    Each speed is the median over the repetitions (one slow outlier does not move it).
    The first-token requests send ``first_token_prompt`` tokens (default ``n_prompt``):
    ``harness ab`` lengthens them until its floor is small beside the first token, and
    a longer first-token prompt is sent after the timed completions, not before: its
    KV cells stay in the slot it used, and the slots share one cache whose used span a
    later decode step may attend over. (Ordered so by that reasoning: on the noisy host
    it was tried on, A/A decode intervals were as wide either way.)
    ``warmup`` more completions run before the timed ones and are not counted
    (``harness ab`` sizes it from a probe start: harness/ab/sampling.py).
    Each request waits ``timeout_s`` at most, and all of them together ``budget_s``
    (default ``MEASURE_BUDGET_S``); ServerApiError when either runs out or a request fails.
    """
    return measure_speeds([base_url], n_prompt, n_gen, repetitions, timeout_s,
                          budget_s=budget_s, first_token_prompt=first_token_prompt,
                          warmup=warmup)[0]


def measure_speeds(base_urls: Sequence[str], n_prompt: int, n_gen: int, repetitions: int,
                   timeout_s: float = REQUEST_TIMEOUT_S, *,
                   budget_s: float | None = None, first_token_prompt: int | None = None,
                   warmup: int = 0) -> list[SpeedSample]:
    """:func:`measure_speed` of several servers at once, request by request in turn: each
    request goes to every server before the next, in the order given and then reversed
    (ABBA...), so each server's figures come from the same seconds as the others'
    (``harness ab``'s alternating design). One server: :func:`measure_speed`. The budget
    is the whole measurement's."""
    budget = _Budget(MEASURE_BUDGET_S if budget_s is None else budget_s,
                     ", ".join(base_urls))
    http = shared_pool()  # one process-wide keep-alive pool: borrowed, never closed here
    first_prompt = prompt_ids(n_prompt if first_token_prompt is None else first_token_prompt)
    first_after = len(first_prompt) > n_prompt
    count = len(base_urls)
    firsts: list[list[float]] = [[] for _ in base_urls]
    if not first_after:
        _first_token_times(http, base_urls, first_prompt, budget, timeout_s, into=firsts)
    prompt_speeds: list[list[float]] = [[] for _ in base_urls]
    decode_speeds: list[list[float]] = [[] for _ in base_urls]
    prompt = prompt_ids(n_prompt)
    for repetition in range(warmup + repetitions):
        for index in _turn(repetition, count):
            with budget.spending(timeout_s) as allowed, ServerClient(
                    base_urls[index], timeout_s=allowed, http=http) as client:
                done = client.completion(prompt, n_predict=n_gen, ignore_eos=True)
            if repetition < warmup:
                continue
            timings = done.raw.get("timings") or {}
            if timings.get("prompt_per_second"):
                prompt_speeds[index].append(float(timings["prompt_per_second"]))
            if timings.get("predicted_per_second") and done.tokens_predicted > 1:
                decode_speeds[index].append(float(timings["predicted_per_second"]))
    if first_after:
        _first_token_times(http, base_urls, first_prompt, budget, timeout_s, into=firsts)
    return [SpeedSample(
        ttft_ms=statistics.median(firsts[i]) if firsts[i] else None,
        prompt_tps=statistics.median(prompt_speeds[i]) if prompt_speeds[i] else None,
        decode_tps=statistics.median(decode_speeds[i]) if decode_speeds[i] else None,
        decode_each=tuple(decode_speeds[i]),
    ) for i in range(count)]


def _turn(round_number: int, count: int) -> range:
    """The servers' order in one round: as given, then reversed, and so on."""
    return range(count) if round_number % 2 == 0 else range(count - 1, -1, -1)


def _first_token_times(http: httpx.Client, base_urls: Sequence[str], prompt: list[int],
                       budget: _Budget, timeout_s: float, *, into: list[list[float]]) -> None:
    # One first-token time is at the mercy of one scheduling hiccup; take the median.
    for sample in range(FIRST_TOKEN_SAMPLES):
        for index in _turn(sample, len(base_urls)):
            with budget.spending(timeout_s) as allowed:
                first = _time_to_first_token(http, base_urls[index], prompt, allowed)
            if first is not None:
                into[index].append(first)


class _Budget:
    """What is left of a measurement's time; each request gets at most that."""

    def __init__(self, total_s: float, base_url: str) -> None:
        self.total_s = total_s
        self.base_url = base_url
        self.deadline = time.monotonic() + total_s

    @contextlib.contextmanager
    def spending(self, timeout_s: float) -> Iterator[float]:
        """A request's timeout: ``timeout_s``, or less when less of the budget is left.
        A request cut short by the budget fails as the budget's, not its own, timeout."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._spent()
        allowed = min(timeout_s, left)
        try:
            yield allowed
        except ServerApiError as exc:
            if allowed < timeout_s and time.monotonic() >= self.deadline:
                raise self._spent() from exc
            raise

    def _spent(self) -> ServerApiError:
        return ServerApiError(
            f"measuring {self.base_url} took longer than its budget of {self.total_s:g}s "
            "(harness.perf.measure.MEASURE_BUDGET_S); the server is too slow for the "
            "measured lengths, or hanging")


#: The longest line the first-token stream may send: one event with one token in it.
MAX_EVENT_BYTES = 1 << 20


def _time_to_first_token(http: httpx.Client, base_url: str, prompt: list[int],
                         timeout_s: float) -> float | None:
    """Milliseconds from sending a one-token streamed completion to its token's event.

    The stream is read to its end before returning: a request left generating behind
    the closed stream would overlap the next one — slowing it, and with a long prompt
    overflowing the KV cache the server's slots share ("Context size has been
    exceeded"; seen with 1024-token prompts). One token ends the task at once. Its
    connection is not kept: a pooled connection that had carried a stream was found
    closed by the server on its next request ("Server disconnected without sending a
    response", about one server start in three with 1024-token prompts). The whole
    stream is held to ``timeout_s`` too, not only each read of it.
    """
    payload = {"prompt": prompt, "n_predict": 1, "temperature": 0.0, "stream": True,
               "cache_prompt": False, "ignore_eos": True}
    url = f"{base_url.rstrip('/')}/completion"
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    first: float | None = None
    try:
        with http.stream("POST", url, json=payload, headers={"Connection": "close"},
                         timeout=timeout_s) as response:
            if response.status_code != 200:
                return None
            pending = b""
            # Bytes, split here: iter_lines would hold one endless line in memory, and
            # check the deadline only when a line ends.
            for chunk in response.iter_bytes():
                if time.monotonic() > deadline:
                    raise ServerApiError(f"the streamed completion at {url} did not end "
                                         f"within {timeout_s:g}s; the server keeps streaming")
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) > MAX_EVENT_BYTES:
                    raise ServerApiError(f"the streamed completion at {url} sent a line of "
                                         f"more than {MAX_EVENT_BYTES} bytes; an event is "
                                         "a few hundred")
                for line in lines:
                    if first is None and line.startswith(b"data:"):
                        first = _first_token_ms(line.decode(errors="replace"), started)
    except httpx.HTTPError as exc:
        raise ServerApiError(f"the streamed completion at {url} failed: {exc!r}") from exc
    return first


def _first_token_ms(line: str, started: float) -> float | None:
    """Milliseconds since ``started`` when ``line`` is an event carrying content."""
    try:
        event = json.loads(line[len("data:"):])
    except ValueError:
        return None
    if isinstance(event, dict) and event.get("content") is not None:
        return (time.perf_counter() - started) * 1000.0
    return None


def peak_host_mib(pid: int | None) -> float | None:
    """The process's peak resident set (``VmHWM``) in MiB; None once it is gone."""
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return None


def vram_mib(pid: int | None) -> float | None:
    """GPU memory the process holds, summed over devices: NVML, else AMD SMI; else None."""
    if pid is None:
        return None
    nvidia = _nvml_vram_mib(pid)
    return nvidia if nvidia is not None else amd_vram_mib(pid)


def amd_vram_mib(pid: int, amdsmi: Any = None) -> float | None:
    """VRAM ``pid`` holds on AMD GPUs through AMD SMI (``amdsmi``: the module or a stand-in).

    ROCm 6.1+ lists processes as dicts with ``memory_usage.vram_mem`` (bytes); older
    releases list handles that ``amdsmi_get_gpu_process_info`` turns into such a dict
    (``mem`` there). None without the module, without a device, or without the process.
    """
    module = amdsmi
    if module is None:
        try:
            module = importlib.import_module("amdsmi")
        except ImportError:  # no ROCm SMI here: not an AMD machine
            return None
    try:
        module.amdsmi_init()
    except Exception:
        return None
    try:
        used = 0
        found = False
        for handle in module.amdsmi_get_processor_handles():
            for entry in module.amdsmi_get_gpu_process_list(handle):
                info = (entry if isinstance(entry, dict)
                        else module.amdsmi_get_gpu_process_info(handle, entry))
                if int(info.get("pid", -1)) != pid:
                    continue
                memory = info.get("memory_usage") or {}
                vram = memory.get("vram_mem", info.get("mem"))
                if vram is not None:
                    used += int(vram)
                    found = True
        return used / (1024.0 * 1024.0) if found else None
    except Exception:  # an SMI that fails mid-way: the figure is left out, never guessed
        return None
    finally:
        with contextlib.suppress(Exception):
            module.amdsmi_shut_down()


def _nvml_vram_mib(pid: int) -> float | None:
    try:
        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver here: the figure is simply not available
        return None
    try:
        used = 0
        found = False
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    used += int(proc.usedGpuMemory)
                    found = True
        return used / (1024.0 * 1024.0) if found else None
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def kv_mib(log_text: str) -> float | None:
    """Every KV cache the server logged (target, SWA, drafter), in MiB as printed."""
    lines = parse_kv_cache_lines(log_text)
    if not lines:
        return None
    return float(sum(line.size_mib for line in lines))


