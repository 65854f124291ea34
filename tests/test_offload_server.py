"""An offload plan reaches the real server: the blocks planned for RAM are the ones it moves.

The ``moe`` fixture (2 blocks, 4 experts) is sized here from its own tensors with
``gguf.GGUFReader`` (the GGUF facts probe fills ``layer_bytes`` the same way), and given
a VRAM budget that holds the residue and exactly one block's experts, so the planner
must emit ``--n-cpu-moe 1``. At ``-lv 5`` llama-server names every tensor whose buffer
type an override moved: ``tensor blk.0.ffn_gate_exps.weight (0 MiB f32) buffer type
overridden to CPU`` (measured on the pinned build).
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import pytest

from harness import modelgen
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.launch import LaunchSpec
from harness.planning.offload import (
    COMPUTE_RESERVE_BYTES,
    DEFAULT_MARGIN_BYTES,
    OffloadKind,
    plan_offload,
)
from harness.plugin import StartServer

pytestmark = pytest.mark.server

#: llama.cpp's own patterns (common/common.h): LLM_FFN_EXPS_REGEX is what --n-cpu-moe and
#: --cpu-moe move; LLM_FFN_DENSE_REGEX is what --n-cpu-ffn moves.
_EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_DENSE_FFN = re.compile(r"\.ffn_(up|down|gate)\.|_shexp")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
#: The DEBUG line llama-model.cpp writes for each tensor an override moved (-lv 5).
_OVERRIDDEN = re.compile(r"tensor (\S+) \([^)]*\) buffer type overridden to CPU")
_DEBUG_VERBOSITY = 5
_KV_BYTES = 128 * 1024


def _facts(path: Path) -> tuple[ModelFacts, dict[int, set[str]]]:
    """ModelFacts with exact per-layer sizes, and each block's expert tensor names."""
    reader = gguf.GGUFReader(path)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())

    def key(template: str) -> int:
        return int(reader.fields[template.format(arch=arch)].contents())

    blocks = key(gguf.Keys.LLM.BLOCK_COUNT)
    sizes = {i: {"expert": 0, "dense_ffn": 0, "other": 0} for i in range(blocks)}
    expert_names: dict[int, set[str]] = {i: set() for i in range(blocks)}
    non_layer = 0
    for tensor in reader.tensors:
        block = _BLOCK.match(tensor.name)
        if block is None:
            non_layer += int(tensor.n_bytes)
            continue
        index = int(block.group(1))
        if _EXPERTS.search(tensor.name):
            sizes[index]["expert"] += int(tensor.n_bytes)
            expert_names[index].add(tensor.name)
        elif _DENSE_FFN.search(tensor.name):
            sizes[index]["dense_ffn"] += int(tensor.n_bytes)
        else:
            sizes[index]["other"] += int(tensor.n_bytes)
    head_count_kv = key(gguf.Keys.Attention.HEAD_COUNT_KV)
    head_count = key(gguf.Keys.Attention.HEAD_COUNT)
    embedding = key(gguf.Keys.LLM.EMBEDDING_LENGTH)
    facts = ModelFacts(
        path=str(path), file_size=path.stat().st_size, architecture=arch,
        block_count=blocks, context_length=key(gguf.Keys.LLM.CONTEXT_LENGTH),
        embedding_length=embedding, head_count=head_count,
        head_count_kv=(head_count_kv,) * blocks, key_length=embedding // head_count,
        value_length=embedding // head_count,
        vocab_size=len(reader.fields[gguf.Keys.Tokenizer.LIST].data),
        expert_count=key(gguf.Keys.LLM.EXPERT_COUNT),
        expert_used_count=key(gguf.Keys.LLM.EXPERT_USED_COUNT),
        layer_bytes=tuple(LayerBytes(i, **sizes[i]) for i in range(blocks)),
        non_layer_bytes=non_layer)
    return facts, expert_names


def test_n_cpu_moe_plan_moves_exactly_the_planned_blocks(
        fixture_set: modelgen.FixtureSet, start_server: StartServer) -> None:
    path = fixture_set.model("moe")
    model, expert_names = _facts(path)
    residue = model.non_layer_bytes + sum(layer.other + layer.dense_ffn
                                          for layer in model.layer_bytes)
    reserves = DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES + _KV_BYTES
    # Room for the residue and exactly the last block's experts: block 0's must move.
    vram = reserves + residue + model.layer_bytes[-1].expert
    plan = plan_offload(model, vram, _KV_BYTES, ram_budget_bytes=1 << 40)
    assert (plan.kind, plan.n) == (OffloadKind.N_CPU_MOE, 1), plan.reason
    assert plan.flags == ("--n-cpu-moe", "1", "-ngl", str(model.block_count + 1))

    server = start_server(LaunchSpec(model=path, ctx_size=512, extra_args=plan.flags,
                                     log_verbosity=_DEBUG_VERBOSITY))
    log = server.log_text()
    assert "tensor overrides to CPU are used with mmap enabled" in log
    moved = set(_OVERRIDDEN.findall(log))
    planned = set().union(*(expert_names[i] for i in range(plan.n or 0)))
    assert planned, "the fixture has no expert tensors in block 0"
    assert moved == planned, log[-3000:]
