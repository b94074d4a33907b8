"""The components an engine's thread owns, built from its config: the model loaded, the KV pool sized,
the radix tree, the attention backend, the runner with its tensor parallelism, CUDA graphs or native
step, the disk tier and the scheduler over them."""

from __future__ import annotations

from agentkv.engine.config import EngineConfig
from agentkv.engine.core import Components
from agentkv.engine.cuda_graphs import DecodeGraphs, cuda_graphs_wanted
from agentkv.engine.disk.setup import tier_for
from agentkv.engine.loader import DTYPES, load_model
from agentkv.engine.memory import KVPool, ReqToTokenPool, kv_slots
from agentkv.engine.native_step import native_step_for
from agentkv.engine.null_cache import NullPrefixCache
from agentkv.engine.parallel import TensorParallel
from agentkv.engine.radix_cache import RadixCache
from agentkv.engine.runner import ModelRunner
from agentkv.engine.scheduler import Scheduler
from agentkv.errors import RequestError
from agentkv.kernels import cpu_native, get_backend
from agentkv.kernels.triton_backend import fused_ops_for


def build_components(cfg: EngineConfig, model: str | None, device: str, dtype: str, overlap: bool) -> Components:
    """An engine's components. Runs on the thread that computes: the engine thread, or with overlap on
    CPU the forward worker (see EngineCore._host_only), so that thread also owns every tensor."""
    tp = cfg.tensor_parallel
    native = cpu_native.for_engine(cfg.native_kernels, device, dtype)
    if cfg.prompt_precision == "bfloat16":  # (an engine's own view of the shared library)
        if native is None:
            raise RequestError("prompt_precision='bfloat16' is the native CPU kernels' opt-in; they do not "
                               "run here (leave prompt_precision unset)")
        native = native.with_exact_bf16()
    loaded = load_model(model, dtype=dtype, device=device, shard=(0, tp) if tp > 1 else None, native=native,
                        quantized=cfg.quantized_weights, load_format=cfg.load_format,
                        fused=fused_ops_for(cfg.fused_ops, device))
    mc = loaded.config  # with tensor parallelism, this rank's share of the heads
    context = min(cfg.context_length or mc.max_position_embeddings, mc.max_position_embeddings)
    kv_dtype = DTYPES[cfg.kv_dtype or dtype]
    slots = cfg.cache.num_slots or kv_slots(mc, kv_dtype, context, device, cfg.cache.memory_fraction)
    pool = KVPool(mc, slots, kv_dtype, device)
    req_pool = ReqToTokenPool(cfg.cache.max_running_requests, context + 1, device)
    tree = (RadixCache(pool.free, int(cfg.cache.pin_budget_fraction * pool.capacity))
            if cfg.cache.enable_radix_cache else NullPrefixCache())
    backend = get_backend(cfg.attention_backend, device, native=native is not None)
    if (any(mc.layer_windows) or mc.attn_softcap or mc.attention_sinks) and backend.name == "flashinfer":
        raise RequestError("this model has sliding-window layers, soft-capped attention or attention sinks, "
                           "which the flashinfer backend does not do yet: use attention_backend='triton' "
                           "(or 'auto')")
    runner = ModelRunner(loaded.model, pool, req_pool, backend, device)
    runner.kernels = native
    if tp > 1:
        runner.tp = TensorParallel(tp, model, dtype, device, pool.num_slots, backend.name, native is not None,
                                   cfg.kv_dtype or dtype)
    elif cuda_graphs_wanted(cfg, runner.backend):
        runner.graphs = DecodeGraphs(
            runner, min(cfg.cuda_graph_max_batch, cfg.cache.max_running_requests), context)
    runner.native_step = native_step_for(cfg.native_step, runner, native)
    tier = tier_for(cfg, loaded.path, mc, kv_dtype, native is not None)
    return Components(scheduler=Scheduler(cfg.scheduler, pool, req_pool, tree, tier), runner=runner,
                      tokenizer=loaded.tokenizer, pool=pool, req_pool=req_pool, tree=tree, model_config=mc,
                      context_length=context, overlap=overlap, tier=tier)
