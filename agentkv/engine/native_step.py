"""The decode step in one native call (csrc/cpu_step.c) for Llama-family models (and Gemma 2 / 3:
norms around attention and the MLP, GeGLU, scaled embeddings, soft caps, their own rotation for
windowed layers; Gemma 4: shapes a layer, shared KV, per-layer inputs (csrc/cpu_step_gemma4.h);
mixtures of experts (softmax or DeepSeek-V3's grouped routers, a shared expert), gpt-oss's sinks and
clamped experts included: csrc/cpu_step_moe.h) on CPU whose linears are tiled
quantized weights (a GGUF's matrices in any type the tiles take: kernels/cpu_quant.py's QUANT_TYPES, on a
CPU with AVX-512 VNNI or AVX2; a mixture of experts' fp32 router needs AVX-512).

A decode step of the Python path is ~270 kernel calls, each a parallel region woken from Python: for
the embedded 135M model they cost more than its arithmetic. Here the model is described to C once
(pointers to its tiled weights, norms, KV caches and rotation tables, held in ctypes structures that
this object keeps alive with the tensors they point into), and a decode-only pass of up to 16 tokens
is one call, and so is any pass of up to 16 tokens the model wrote: jump-forward's forced tokens,
drafts being checked. It sits where CUDA graphs sit on a GPU (the
runner asks `can_run`, then `run`); longer passes and a prompt's tokens (computed exactly:
linear.by_row_kind) take the Python path. Sampling, grammar
masks and the scheduler stay in Python.

The step runs the Python path's kernels in its order, so its logits are the same bits (tests check),
but for attention over 1,024 keys and more, where the Python path splits a token's keys across
threads (flash-decoding) and the step does not.
"""

from __future__ import annotations

import ctypes
import logging
from ctypes import c_float, c_int64, c_void_p

import torch

from agentkv.engine.gemma4 import Gemma4Layer
from agentkv.engine.linear import Linear
from agentkv.engine.model import CausalLM, DecoderLayer, MoE, QuantEmbedding, SandwichDecoderLayer, finish_logits
from agentkv.errors import EngineError, RequestError
from agentkv.kernels.cpu_native import NativeKernels
from agentkv.kernels.cpu_quant import RESCORE_TOP, QuantWeight

MAX_TOKENS = 16  # tokens one call takes, and logit rows it returns (the tiled kernel's rows)


MAX_PARTS = 3  # a linear's parts of different types (q, k, v)


class _Part(ctypes.Structure):
    _fields_ = [("qtype", c_int64), ("N", c_int64), ("tiles", c_void_p)]


class _Mat(ctypes.Structure):
    _fields_ = [("N", c_int64), ("K", c_int64), ("bias", c_void_p), ("parts", c_int64), ("part", _Part * MAX_PARTS)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", c_void_p), ("mlp_norm", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p),
                ("qkv", _Mat), ("o", _Mat), ("gate_up", _Mat), ("down", _Mat),
                ("k_cache", c_void_p), ("v_cache", c_void_p), ("cos", c_void_p), ("sin", c_void_p),
                ("window", c_int64), ("post_attn_norm", c_void_p), ("post_mlp_norm", c_void_p), ("sinks", c_void_p),
                ("experts", c_int64), ("top_k", c_int64), ("norm_topk", c_int64), ("routed_scaling", c_float),
                ("router", c_void_p), ("router_bias", c_void_p), ("expert_gate_up", c_void_p),
                ("expert_down", c_void_p), ("score_bias", c_void_p), ("groups", c_int64), ("groups_chosen", c_int64),
                ("shared_gate_up", _Mat), ("shared_down", _Mat),
                ("kv_heads", c_int64), ("head_dim", c_int64), ("rot", c_int64), ("inter", c_int64),
                ("reads_kv", c_int64), ("k_eq_v", c_int64), ("v_norm", c_void_p),
                ("pl_gate", _Mat), ("pl_out", _Mat), ("pl_norm", c_void_p), ("scaled", c_int64), ("scalar", c_float),
                ("moe_norm", c_void_p), ("router_norm", c_void_p), ("mlp_out_norm", c_void_p),
                ("moe_out_norm", c_void_p), ("expert_scale", c_void_p)]


class _Model(ctypes.Structure):
    _fields_ = [(name, c_int64) for name in ("layers", "hidden", "heads", "vocab", "num_slots", "positions")] + \
               [(name, c_float) for name in ("eps", "scale", "attn_softcap", "embed_scale")] + \
               [("embed_qtype", c_int64), ("embed_tiled", c_int64), ("embed", c_void_p), ("final_norm", c_void_p),
                ("lm_head", _Mat), ("rescore", c_int64), ("layer", c_void_p), ("kv_bf16", c_int64), ("gelu", c_int64),
                ("residual_scale", c_float), ("swiglu_limit", c_float), ("swiglu_alpha", c_float),
                ("pl_width", c_int64), ("pl_qtype", c_int64), ("pl_vocab", c_int64), ("pl_table", c_void_p),
                ("pl_proj", _Mat), ("pl_norm", c_void_p),
                ("pl_table_scale", c_float), ("pl_proj_scale", c_float), ("pl_sum_scale", c_float)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def unsupported(model: CausalLM, kernels: NativeKernels | None, kv_dtype: torch.dtype) -> str | None:
    """Why this model's decode cannot be the native step; None when it can."""
    cfg = model.config
    if kernels is None or not kernels.qtile_fast:
        return "the native kernels or their tiled bodies (AVX-512 VNNI or AVX2) are not on this CPU"
    if model.norm.weight.dtype != torch.float32:
        return "the step computes in float32"
    if kv_dtype not in (torch.float32, torch.bfloat16):
        return f"the step keeps KV in float32 or bfloat16, not {kv_dtype}"
    if cfg.conv_layers or cfg.kv_lora_rank:
        return "the model has short convolution layers (LFM2) or latent attention (DeepSeek-V3), which the step " \
               "does not take"
    why = _unsupported_per_layer_inputs(model)
    if why:
        return why
    for layer in model.layers:
        if not isinstance(layer, (DecoderLayer, SandwichDecoderLayer, Gemma4Layer)):
            return "a layer is not a decoder layer the step takes"
        attn, mlp = layer.self_attn, layer.mlp
        if attn.head_dim > kernels.max_head_dim:
            return f"head_dim {attn.head_dim} is over the attention kernel's {kernels.max_head_dim}"
        for width in (cfg.hidden_size, attn.num_heads * attn.head_dim, *(() if isinstance(mlp, MoE) else
                                                                           (mlp.intermediate,))):
            if width % 32:
                return f"a width of {width} is not whole blocks of 32"
        moe = _experts_of(layer)
        linears = [] if isinstance(mlp, MoE) else [mlp.gate_up_proj, mlp.down_proj]
        if moe is not None:
            why = _unsupported_moe(moe)
            if why:
                return why
            shared = [moe.shared.gate_up_proj, moe.shared.down_proj] if moe.shared is not None else []
            linears += [p for e in moe.experts for p in (e.gate_up_proj, e.down_proj)] + shared
        if isinstance(layer, Gemma4Layer):
            linears += [layer.per_layer_gate_proj, layer.per_layer_out_proj] if layer.per_layer else []
        qkv = attn.q_proj if _reads_kv(layer) else attn.qkv_proj
        for lin in (qkv, attn.o_proj, *linears):
            if lin.all_reduce or lin.quantized is None or not lin.quantized.tiled:
                return NOT_TILED
    head = model.logits_proj.weight if model.logits_proj is not None else None
    if not (isinstance(head, QuantWeight) and head.tiled):
        return "the vocabulary projection is not a tiled quantized weight"
    return None


def _experts_of(layer) -> MoE | None:
    """A layer's mixture of experts: in the MLP's place, or beside it (Gemma 4's)."""
    if isinstance(layer, Gemma4Layer):
        return layer.moe
    return layer.mlp if isinstance(layer.mlp, MoE) else None


NOT_TILED = "a linear is not a tiled quantized weight (a GGUF's, in a type the tiles take)"


def _reads_kv(layer) -> bool:
    """A Gemma 4 layer that attends over an earlier layer's K/V (its projection is q's alone)."""
    return isinstance(layer, Gemma4Layer) and layer.self_attn.source != layer.layer_id


def _unsupported_per_layer_inputs(model: CausalLM) -> str | None:
    """Why Gemma 4's per-layer inputs are not in the step; None where they are (or the model has none): a table
    in fp32 or a GGUF's blocks, a projection of tiles, a width of whole blocks of 32."""
    pli = model.per_layer_inputs
    if pli is None:
        return None
    if pli.width % 32:
        return f"the per-layer inputs' width {pli.width} is not whole blocks of 32"
    table = pli.table
    if isinstance(table, QuantEmbedding) and table.weight.tiled or \
            not isinstance(table, QuantEmbedding) and table.weight.dtype != torch.float32:
        return "the per-layer inputs' table is neither fp32 nor a GGUF's blocks"
    proj = pli.per_layer_model_proj
    if proj.all_reduce or proj.quantized is None or not proj.quantized.tiled:
        return NOT_TILED
    return None


def _unsupported_moe(moe: MoE) -> str | None:
    """Why a mixture of experts' layer is not in the step; None when it is (softmax or sigmoid-group routers
    in fp32 on agentkv's linear kernel, experts of one width, an ungated shared expert of tiles)."""
    if moe.shared_gate is not None:
        return "the mixture of experts' gated shared expert (Qwen2-MoE) is not in the step"
    if moe.router.native_weight is None or moe.router.native_weight.data.dtype != torch.float32:
        return "the mixture of experts' router is not an fp32 matrix on agentkv's linear kernel"
    if moe.experts[0].intermediate % 32 or any(e.intermediate != moe.experts[0].intermediate for e in moe.experts):
        return "the experts' width is not whole blocks of 32, or not one width"
    if moe.shared is not None and moe.shared.intermediate % 32:
        return "the shared expert's width is not whole blocks of 32"
    if moe.sigmoid_groups and (moe.groups > 256 or len(moe.experts) % moe.groups):
        return "the router's expert groups are over 256 or do not divide the experts"
    return None


def native_step_for(option: bool | None, runner, kernels: NativeKernels | None) -> NativeStep | None:
    """The step an engine's runner uses: `option` None where the model qualifies, True required
    (a RequestError saying why not), False none. Tensor parallelism keeps the Python path."""
    if option is False:
        return None
    if runner.tp is not None or runner.graphs is not None:
        why = "tensor parallelism or CUDA graphs run this engine's decode"
    else:
        why = unsupported(runner.model, kernels, runner.pool.kv_caches[0][0].dtype)
    if why is None:
        return NativeStep(runner, kernels)
    if option:
        raise RequestError(f"native_step=True, but {why}; leave native_step unset to use it where it applies")
    if kernels is not None and kernels.qtile_fast and any(
            isinstance(m, Linear) and m.quantized is not None and m.quantized.tiled for m in runner.model.modules()):
        # (a file's blocks in tiles, as a fast decode has them: say why it is not the step's)
        logging.getLogger("agentkv").warning(
            "agentkv: this model decodes on the Python path, a few times slower than the native step: %s", why)
    return None


class NativeStep:
    """Decode-only passes of a runner's model as one call of csrc/cpu_step.c."""

    def __init__(self, runner, kernels: NativeKernels):
        model: CausalLM = runner.model
        cfg = model.config
        self.runner, self.kernels, self.calls = runner, kernels, 0
        self._keep: list[torch.Tensor] = []  # every tensor a pointer below reaches into
        self._arrays: list = []  # the ctypes arrays of experts' matrices the layers point into

        def vec(t: torch.Tensor | None) -> int | None:
            if t is None:
                return None
            t = t.detach().contiguous()
            self._keep.append(t)
            return t.data_ptr()

        def mat(lin: Linear | QuantWeight) -> _Mat:
            w = lin if isinstance(lin, QuantWeight) else lin.quantized
            bias = None if isinstance(lin, QuantWeight) else lin.bias
            self._keep.append(w.data)
            parts = w.parts or (w,)
            assert len(parts) <= MAX_PARTS
            return _Mat(w.out_features, w.in_features, vec(bias), len(parts),
                        (_Part * MAX_PARTS)(*(_Part(p.qtype, p.out_features, p.data.data_ptr()) for p in parts)))

        rope = model.rope
        tables = {id(r): (vec(r.cos), vec(r.sin)) for r in (model.rope, model.local_rope) if r is not None}
        layers = (_Layer * cfg.num_layers)()
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            gemma4, reads = isinstance(layer, Gemma4Layer), _reads_kv(layer)
            # (Gemma 4's layers that read an earlier layer's K/V attend over its caches; theirs are empty)
            k_cache, v_cache = runner.pool.kv_caches[attn.source if gemma4 else i]
            # Gemma 3's windowed layers rotate by their own tables, as CausalLM.forward picks them
            own_rope = model.local_rope if model.local_rope is not None and attn.window else rope
            cos, sin = tables[id(own_rope)]
            if not getattr(attn, "rotates", True):  # (SmolLM3's layers without rope: the step skips the rotation)
                cos = sin = None
            sandwich = isinstance(layer, (SandwichDecoderLayer, Gemma4Layer))
            mlp_norm = layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm
            moe = _experts_of(layer)
            dense = (_Mat(), _Mat()) if isinstance(mlp, MoE) else (mat(mlp.gate_up_proj), mat(mlp.down_proj))
            k_norm, sinks = getattr(attn, "k_norm", None), getattr(attn, "sinks", None)
            per_layer = gemma4 and layer.per_layer
            layers[i] = _Layer(vec(layer.input_layernorm.weight), vec(mlp_norm.weight),
                               vec(attn.q_norm.weight if attn.q_norm else None),
                               vec(k_norm.weight if k_norm is not None else None),
                               mat(attn.q_proj if reads else attn.qkv_proj), mat(attn.o_proj), *dense,
                               k_cache.data_ptr(), v_cache.data_ptr(), cos, sin, attn.window,
                               vec(layer.post_attention_layernorm.weight) if sandwich else None,
                               vec(layer.post_feedforward_layernorm.weight) if sandwich else None,
                               vec(sinks.float() if sinks is not None else None),
                               *(self._experts(moe, mat, vec) if moe is not None else (0,) * 11 + (_Mat(), _Mat())),
                               attn.num_kv_heads, attn.head_dim, own_rope.rot,
                               cfg.intermediate_size if isinstance(mlp, MoE) else mlp.intermediate,
                               int(reads), int(gemma4 and attn.k_eq_v and not reads),
                               vec(attn.v_norm.weight) if gemma4 and not reads else None,
                               mat(layer.per_layer_gate_proj) if per_layer else _Mat(),
                               mat(layer.per_layer_out_proj) if per_layer else _Mat(),
                               vec(layer.post_per_layer_input_norm.weight) if per_layer else None,
                               int(gemma4), float(layer.layer_scalar) if gemma4 else 0.0,
                               *(self._beside(layer, vec) if gemma4 and moe is not None else (None,) * 5))
        embed_args = self._table(model.embed_tokens, vec)
        attn0 = model.layers[0].self_attn
        self._layers = layers
        self._model = _Model(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.vocab_size,
                             runner.pool.kv_caches[0][0].shape[0], rope.cos.shape[0], cfg.rms_norm_eps, attn0.scale,
                             getattr(attn0, "softcap", None) or 0.0,
                             model.embed_scale or (cfg.embedding_multiplier if cfg.embedding_multiplier != 1.0
                                                   else 0.0), *embed_args,
                             vec(model.norm.weight), mat(model.logits_proj.weight), RESCORE_TOP,
                             ctypes.addressof(layers), int(runner.pool.kv_caches[0][0].dtype == torch.bfloat16),
                             int(cfg.hidden_act == "gelu_tanh"),
                             cfg.residual_multiplier if cfg.residual_multiplier != 1.0 else 0.0,
                             cfg.swiglu_limit if cfg.hidden_act == "swiglu_clamped" else 0.0, cfg.swiglu_alpha,
                             *self._per_layer_inputs(model, mat, vec))
        self.config = cfg
        self.generic = False  # tests: the plain-C bodies on CPUs with AVX-512 too
        self.threads = torch.get_num_threads()  # the engine's (host.usable_cores); a step may run on fewer

    def _experts(self, moe: MoE, mat, vec) -> tuple:
        """A mixture of experts' _Layer fields: its counts, the router packed for cpu_linear.c and its bias, and
        arrays of each expert's gate_up and down (kept alive with this step)."""
        gate_ups = (_Mat * len(moe.experts))(*(mat(e.gate_up_proj) for e in moe.experts))
        downs = (_Mat * len(moe.experts))(*(mat(e.down_proj) for e in moe.experts))
        self._arrays += [gate_ups, downs]
        router, shared = moe.router, moe.shared
        return (len(moe.experts), moe.top_k, int(moe.norm_topk_prob), moe.scaling, vec(router.native_weight.data),
                vec(router.bias), ctypes.addressof(gate_ups), ctypes.addressof(downs),
                vec(moe.score_bias.float()) if moe.sigmoid_groups else None, moe.groups, moe.groups_chosen,
                *((mat(shared.gate_up_proj), mat(shared.down_proj)) if shared is not None else (_Mat(), _Mat())))

    def _table(self, table: QuantEmbedding | torch.nn.Embedding, vec) -> tuple[int, int, int]:
        """An embedding table as the step reads it: its type (-1: fp32), whether its blocks are tiled, its data."""
        if isinstance(table, QuantEmbedding):
            self._keep.append(table.weight.data)
            return table.weight.qtype, int(table.weight.tiled), table.weight.data.data_ptr()
        return -1, 0, vec(table.weight.float())

    @staticmethod
    def _beside(layer: Gemma4Layer, vec) -> tuple:
        """Gemma 4's experts beside the MLP: their input's norm, the router's, the two outputs' and the scales."""
        return (vec(layer.pre_feedforward_layernorm_2.weight), vec(layer.router_norm.weight),
                vec(layer.post_feedforward_layernorm_1.weight), vec(layer.post_feedforward_layernorm_2.weight),
                vec(layer.moe.expert_scale.float()))

    def _per_layer_inputs(self, model: CausalLM, mat, vec) -> tuple:
        """Gemma 4's per-layer inputs' _Model fields (zeros where the model has none): the width, the table's type
        (-1: fp32), rows and data, the projection, its norm, and the scales the Python path multiplies by."""
        pli = model.per_layer_inputs
        if pli is None:
            return 0, -1, 0, None, _Mat(), None, 0.0, 0.0, 0.0
        qtype, _, data = self._table(pli.table, vec)  # (its blocks never tiled: unsupported)
        return (pli.width, qtype, model.config.per_layer_vocab, data, mat(pli.per_layer_model_proj),
                vec(pli.norm.weight), pli.width**0.5, pli.hidden**-0.5, 2**-0.5)

    def can_run(self, inputs) -> bool:
        """A pass of at most 16 tokens the model wrote (decodes, jump-forward's, drafts: no prompt's,
        which the Python path computes exactly) whose logits are wanted for at most 16."""
        return 0 < len(inputs.ids) <= MAX_TOKENS and len(inputs.select) <= MAX_TOKENS and not inputs.prompt_rows

    @torch.inference_mode()
    def run(self, dev, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [len(select), vocab] (fp32) of a pass (`dev`: runner.OnDevice; `ids` its tokens,
        placeholders resolved), and the selected tokens' final normed states [len(select), hidden]."""
        meta = dev.meta
        rows = meta.req_rows
        if len(meta.extend_lens) != ids.shape[0]:  # an extend's tokens: its request's row for each
            rows = rows.repeat_interleave(torch.tensor(meta.extend_lens))
        select = dev.select.contiguous()
        logits = torch.empty(select.shape[0], self._model.vocab, dtype=torch.float32)
        hidden = torch.empty(select.shape[0], self._model.hidden, dtype=torch.float32)
        lora = dev.lora.step_lora() if dev.lora is not None else None  # (each token's LoRA adapter)
        bad = self.kernels.decode_step(ctypes.addressof(self._model), ids.contiguous(), dev.positions.contiguous(),
                                       meta.out_cache_loc.contiguous(), self.runner.req_pool.table,
                                       rows.contiguous(), select, logits, hidden, self.generic, self.threads,
                                       None if lora is None else ctypes.addressof(lora))
        if bad:
            what = {1: "a token id", 2: "a position", 3: "a new token's slot", 4: "a slot-table row",
                    5: "a slot in the table", 6: "the number of tokens or selected rows",
                    7: "memory for the step", 8: "a LoRA adapter's index or rank"}.get(bad, str(bad))
            raise EngineError(f"the native decode step refused the pass: {what} is out of range (an engine bug; "
                              "native_step=False serves meanwhile)")
        self.calls += 1
        # the threads the step's pool found the machine gives (csrc/cpu_pool.c: fewer while other processes
        # hold cores) for torch's ops and the Python path's kernels too: their regions wait on a thread
        # that lost its core as the step's barriers do
        use = self.kernels.pool_threads(self.threads)
        if use != torch.get_num_threads():
            torch.set_num_threads(use)
        return finish_logits(logits, self.config), hidden  # (after the re-score: each keeps the order)
