"""The KV cache types a tune may choose, with their quality weights (configs/gpu/kv_quality.json).

A candidate's rank is its predicted decode speed times its cache types' weight, so a
smaller cache that reads faster must win by more than the precision it gives up. A type
the file does not list is never proposed. The read cost scales the cache bytes a decode
step reads in the prediction (reference 004, docs/references.md: q4_0 read through flash
attention was about 12 times slower per byte on one card family).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from harness.data_schema import fail_if_any, load_json, problem
from harness.errors import ConfigError
from harness.probes.gpu_configs import GPU_CONFIG_DIR

KV_QUALITY_PATH = GPU_CONFIG_DIR / "kv_quality.json"
KV_QUALITY_SCHEMA_PATH = GPU_CONFIG_DIR / "kv_quality.schema.json"


@dataclass(frozen=True)
class KvQuality:
    name: str
    #: 1.0 is lossless.
    quality: float
    #: Relative time to read a byte of this cache in decode (f16: 1).
    read_cost: float


def load_kv_quality(path: Path | None = None) -> Mapping[str, KvQuality]:
    """The weighted cache types by name, in file order; a name listed twice is refused."""
    path = KV_QUALITY_PATH if path is None else path
    obj = load_json(path, KV_QUALITY_SCHEMA_PATH, ConfigError)
    found: dict[str, KvQuality] = {}
    duplicates: list[str] = []
    for index, item in enumerate(obj["types"]):
        name = str(item["name"])
        if name in found:
            duplicates.append(problem(path, f"$.types[{index}].name", name, "a duplicate",
                                      "a name no other entry uses"))
        found[name] = KvQuality(name, float(item["quality"]), float(item["read_cost"]))
    fail_if_any(ConfigError, duplicates)
    return MappingProxyType(found)


def pair_quality(weights: Mapping[str, KvQuality], k_type: str, v_type: str) -> float | None:
    """The weight of a K/V pair: the lower of the two (the worse cache bounds the
    precision); None when either type has no weight."""
    k, v = weights.get(k_type), weights.get(v_type)
    return None if k is None or v is None else min(k.quality, v.quality)


def pair_read_cost(weights: Mapping[str, KvQuality], k_type: str, v_type: str) -> float:
    """The read cost of a K/V pair: the mean of the two (each is half the bytes of a
    same-type pair); 1 for a type without a weight."""
    k, v = weights.get(k_type), weights.get(v_type)
    return ((k.read_cost if k else 1.0) + (v.read_cost if v else 1.0)) / 2
