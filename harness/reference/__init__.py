"""An independent numpy forward pass for GGUF models: the oracle for output correctness.

``load_reference(path)`` reads a GGUF file with gguf-py only (``gguf.GGUFReader`` and
``gguf.quants.dequantize``: nothing else of llama.cpp), dequantizes every tensor once,
and returns a ``ReferenceModel`` whose ``logits(tokens)`` is the causal forward over
the whole sequence in float64, each step ported from the pinned llama.cpp graph it
mirrors (``src/models/llama.cpp``, ``gemma2.cpp``, ``glm4-moe.cpp`` and the helpers in
``src/llama-graph.cpp``). A server's ``n_probs`` distributions are compared against it.

One module per job: ``gguf_read`` (file to arrays), ``hparams`` (metadata to
hyperparameters), ``named_tensors`` (tensor lookup by GGUF name), ``ops`` (norms, activations,
soft-capping), ``rope``, ``attention``, ``ffn``, ``moe``, one module per architecture,
and ``model`` (the public class and the architecture table).
"""

from __future__ import annotations

from harness.reference.model import ARCHITECTURES, ReferenceModel, load_reference

__all__ = ["ARCHITECTURES", "ReferenceModel", "load_reference"]
