"""The KV-cache step of a launch plan: the planned cache for the settings, or none with
the warning that says why (pure)."""

from __future__ import annotations

from harness.errors import ConfigError
from harness.facts.gpu import ForkKvType, ServerSettings
from harness.facts.model_facts import ModelFacts
from harness.planning.capability import PlanWarning
from harness.planning.kv import CTX_PAD, KvPlan, KvRequest, layout_from_facts, plan_kv
from harness.planning.release_rules import NOT_MODELLED, NotModelled


def plan_kv_step(model: ModelFacts, release: int | None, settings: ServerSettings,
                 fork_kv_types: tuple[ForkKvType, ...],
                 warnings: list[PlanWarning]) -> KvPlan | None:
    """The KV plan of ``model`` on a build of ``release`` for ``settings``; None, with a
    warning appended, where it cannot be planned."""
    try:
        kv = plan_kv(layout_from_facts(model, release), KvRequest(
            ctx_size=settings.ctx_size, parallel=settings.parallel,
            batch_size=settings.batch_size, ubatch_size=settings.ubatch_size,
            cache_type_k=settings.cache_type_k or "f16",
            cache_type_v=settings.cache_type_v or "f16",
            flash_attn=settings.flash_attn or KvRequest().flash_attn,
        ), fork_kv_types)
    except ConfigError as exc:
        # An unmodelled architecture or a cache type with no known block layout: the
        # plan still stands, without a KV figure, and the report says why.
        warnings.append(PlanWarning("kv-unplanned", "kv", "", "", str(exc)))
        return None
    except NotModelled as exc:
        # The build's release lies where a rule changed and no published release says
        # which side it is on: no KV figure is planned, and the warning's words (the
        # "not modelled" finding) reach the report instead of a plan mismatch.
        warnings.append(PlanWarning(NOT_MODELLED, "kv", "", "", str(exc)))
        return None
    asked = settings.ctx_size
    if asked and kv.n_ctx != asked:
        streams = (f"{kv.n_stream} slots of {kv.n_ctx_seq} cells" if kv.n_stream > 1
                   else "one stream all slots share")
        warnings.append(PlanWarning(
            "ctx-padded", "ctx_size", str(asked), str(kv.n_ctx),
            f"llama-server pads --ctx-size {asked} to {kv.n_ctx} cells, {streams} (a "
            f"stream's cells come in multiples of {CTX_PAD}); the plan sizes the KV cache "
            f"for {kv.n_ctx}"))
    if kv.refusal:
        warnings.append(PlanWarning("kv-refused", "cache_type_k", settings.cache_type_k or "",
                                    "", f"the server will refuse this launch: {kv.refusal}"))
    return kv
