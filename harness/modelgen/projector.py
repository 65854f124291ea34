"""Vision projector fixtures: tiny deterministic CLIP-style ``--mmproj`` files.

A projector spec (``fixtures/models/projectors/<name>.json``) names the text fixture it
fits and the vision tower's shape. The file is what llama.cpp's multimodal loader reads
for a LLaVA-style projector (tools/mtmd/clip.cpp, ``PROJECTOR_TYPE_MLP``; the graph in
tools/mtmd/models/llava.cpp): the ``clip.*`` keys, a ViT (patch and position embeddings,
a class embedding, pre-norm, blocks of LayerNorm / attention with biases / GELU MLP) and
the two-layer MLP ``mm.0``/``mm.2`` that maps the patch features into the text model's
embedding width. Measured on the pinned build: ``--mmproj`` with the ``dense`` fixture
logs ``loaded multimodal model``, and an image sent through ``/v1/chat/completions`` is
encoded (``image decoded (batch 1/1)``) and answered.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from harness.data_schema import load_json, schema_file
from harness.errors import FixtureError
from harness.modelgen.rng import WeightRng

PROJECTORS_SUBDIR = "projectors"
#: llama.cpp's multimodal loader's own architecture word and projector type.
CLIP_ARCH = "clip"
MLP_PROJECTOR = "mlp"
_WEIGHT_SCALE = 0.05
SCHEMA = schema_file("projector-spec")
#: CLIP's LayerNorm epsilon and the image normalisation the preprocessor applies.
_EPS = 1e-6
_MEAN_STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class ProjectorSpec:
    """One projector fixture: the text fixture it feeds, and the vision tower's shape."""

    name: str
    description: str
    fits: str
    image_size: int
    patch_size: int
    embedding_length: int
    feed_forward_length: int
    block_count: int
    head_count: int
    seed: int

    @property
    def positions(self) -> int:
        """Patches plus the class embedding's slot."""
        return (self.image_size // self.patch_size) ** 2 + 1


def load_projector_specs(folder: Path, fixture_names: tuple[str, ...]
                         ) -> dict[str, ProjectorSpec]:
    """Every projector spec in ``folder`` by name; FixtureError naming the file and the
    fix for a bad one (schema, or a ``fits`` that names no fixture)."""
    specs: dict[str, ProjectorSpec] = {}
    for path in sorted(folder.glob("*.json")):
        obj = load_json(path, SCHEMA, FixtureError)
        if obj["fits"] not in fixture_names:
            raise FixtureError(f"{path}: $.fits: {json.dumps(obj['fits'])} is not allowed: "
                               f"no such fixture; allowed: one of {', '.join(fixture_names)}")
        if obj["image_size"] % obj["patch_size"]:
            raise FixtureError(f"{path}: $.image_size: {obj['image_size']} is not allowed: "
                               f"not a multiple of patch_size {obj['patch_size']}; allowed: "
                               f"a multiple of {obj['patch_size']}")
        specs[path.stem] = ProjectorSpec(name=path.stem, **obj)
    return specs


def write_projector(spec: ProjectorSpec, text_embedding_length: int, dest: Path) -> None:
    """Write ``spec``'s projector, its output ``text_embedding_length`` wide, to ``dest``."""
    writer = gguf.GGUFWriter(str(dest), CLIP_ARCH)
    e, f = spec.embedding_length, spec.feed_forward_length
    writer.add_name(f"harness projector {spec.name}")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", MLP_PROJECTOR)
    writer.add_bool("clip.use_gelu", True)
    for key, value in (("image_size", spec.image_size), ("patch_size", spec.patch_size),
                       ("embedding_length", e), ("feed_forward_length", f),
                       ("block_count", spec.block_count),
                       ("projection_dim", text_embedding_length),
                       ("attention.head_count", spec.head_count)):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", _EPS)
    writer.add_array("clip.vision.image_mean", list(_MEAN_STD))
    writer.add_array("clip.vision.image_std", list(_MEAN_STD))
    rng = WeightRng(spec.seed)

    def random(name: str, shape: tuple[int, ...]) -> None:
        writer.add_tensor(name, rng.uniform(shape, _WEIGHT_SCALE))

    def norm(prefix: str, width: int) -> None:
        writer.add_tensor(f"{prefix}.weight", np.ones(width, dtype=np.float32))
        writer.add_tensor(f"{prefix}.bias", np.zeros(width, dtype=np.float32))

    def linear(prefix: str, rows: int, cols: int) -> None:
        random(f"{prefix}.weight", (rows, cols))
        writer.add_tensor(f"{prefix}.bias", np.zeros(rows, dtype=np.float32))

    # numpy order, ggml's ne reversed: the patch convolution is ne {p, p, 3, e}.
    random("v.patch_embd.weight", (e, 3, spec.patch_size, spec.patch_size))
    random("v.class_embd", (e,))
    random("v.position_embd.weight", (spec.positions, e))
    norm("v.pre_ln", e)
    for bid in range(spec.block_count):
        block = f"v.blk.{bid}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(f"{block}.{part}", e, e)
        norm(f"{block}.ln1", e)
        norm(f"{block}.ln2", e)
        linear(f"{block}.ffn_up", f, e)
        linear(f"{block}.ffn_down", e, f)
    linear("mm.0", text_embedding_length, e)
    linear("mm.2", text_embedding_length, text_embedding_length)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gradient_png(size: int) -> bytes:
    """A ``size`` x ``size`` RGB PNG of colour gradients: the image the vision tests send
    (deterministic; written with zlib, no imaging library)."""
    rows = b"".join(b"\x00" + bytes(channel for x in range(size)
                                     for channel in (x * 255 // size, y * 255 // size, 128))
                    for y in range(size))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))
