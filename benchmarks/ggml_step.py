"""ggml as the executor of a Llama decode step (library_routes.py's `ggml` route), through ggml-python.

The GGUF's tensors are loaded into a ggml context as they are in the file (Q4_1 / Q8_0 blocks, Q and K
rows in ggml's rotation order), and one graph of a whole step is built once: llama.cpp's graph for a
Llama layer (RMS norm, Q / K / V products, rotation, the new K and V stored into an f16 cache with
`set_rows` at the step's position, flash attention over the cache with a mask hiding later positions,
the output product, SwiGLU), the final norm and the tied vocabulary. A step writes the token, its
position and the mask row into the graph's input tensors and computes the graph on a ggml thread pool:
ggml's own kernels and threads, no graph building between steps, so what it measures is ggml as the
executor, not Python.
"""

from __future__ import annotations

import ctypes
import math
import time

import ggml
import ggml.utils
import numpy as np


def route(path, context: int, threads: int):
    """(run, weight bytes): run(prompt ids, new tokens) -> (greedy tokens, seconds of decoding)."""
    import gguf

    meta = gguf.GGUFReader(str(path))

    def field(name):
        f = meta.fields[name]
        return f.parts[f.data[0]][0]

    arch = "llama"
    layers = int(field(f"{arch}.block_count"))
    heads, kv_heads = int(field(f"{arch}.attention.head_count")), int(field(f"{arch}.attention.head_count_kv"))
    hidden = int(field(f"{arch}.embedding_length"))
    head_dim = hidden // heads
    eps = float(field(f"{arch}.attention.layer_norm_rms_epsilon"))
    base = float(field(f"{arch}.rope.freq_base"))
    n_ctx_orig = int(field(f"{arch}.context_length"))
    weight_bytes = sum(int(t.n_bytes) for t in meta.tensors if t.name.startswith(("blk.", "token_embd")) and
                       len(t.shape) > 1)

    if hasattr(ggml, "ggml_cpu_init"):
        ggml.ggml_cpu_init()
    holder = ctypes.c_void_p()
    where = ctypes.cast(ctypes.pointer(holder), ctypes.POINTER(ctypes.c_void_p))
    params = ggml.gguf_init_params(no_alloc=False, ctx=where)
    if not ggml.gguf_init_from_file(str(path).encode(), params):
        raise RuntimeError(f"ggml could not read {path}")
    wctx = holder.value

    def w(name):
        t = ggml.ggml_get_tensor(wctx, name.encode())
        if not t:
            raise KeyError(name)
        return t

    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=256 * 2**20, mem_buffer=None, no_alloc=False))
    kv_width = head_dim * kv_heads
    caches = [(ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F16, kv_width, context),
               ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F16, kv_width, context)) for _ in range(layers)]
    for k, v in caches:
        ggml.utils.to_numpy(k)[:] = 0
        ggml.utils.to_numpy(v)[:] = 0
    tok = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_I32, 1)
    pos = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_I32, 1)
    row = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_I64, 1)
    mask = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F16, context, ggml.GGML_KQ_MASK_PAD)

    graph = ggml.ggml_new_graph_custom(ctx, 8192, False)
    x = ggml.ggml_get_rows(ctx, w("token_embd.weight"), tok)
    for i in range(layers):
        cur = ggml.ggml_mul(ctx, ggml.ggml_rms_norm(ctx, x, eps), w(f"blk.{i}.attn_norm.weight"))
        q = ggml.ggml_reshape_3d(ctx, ggml.ggml_mul_mat(ctx, w(f"blk.{i}.attn_q.weight"), cur), head_dim, heads, 1)
        k = ggml.ggml_reshape_3d(ctx, ggml.ggml_mul_mat(ctx, w(f"blk.{i}.attn_k.weight"), cur), head_dim, kv_heads, 1)
        v = ggml.ggml_mul_mat(ctx, w(f"blk.{i}.attn_v.weight"), cur)
        q = ggml.ggml_rope_ext(ctx, q, pos, None, head_dim, 0, n_ctx_orig, base, 1.0, 0.0, 1.0, 32.0, 1.0)
        k = ggml.ggml_rope_ext(ctx, k, pos, None, head_dim, 0, n_ctx_orig, base, 1.0, 0.0, 1.0, 32.0, 1.0)
        kc, vc = caches[i]
        k = ggml.ggml_reshape_2d(ctx, k, kv_width, 1)
        ggml.ggml_build_forward_expand(graph, ggml.ggml_set_rows(ctx, kc, k, row))
        ggml.ggml_build_forward_expand(graph, ggml.ggml_set_rows(ctx, vc, v, row))
        es = 2  # f16
        kview = ggml.ggml_view_3d(ctx, kc, head_dim, context, kv_heads, kv_width * es, head_dim * es, 0)
        vview = ggml.ggml_view_3d(ctx, vc, head_dim, context, kv_heads, kv_width * es, head_dim * es, 0)
        att = ggml.ggml_flash_attn_ext(ctx, ggml.ggml_permute(ctx, q, 0, 2, 1, 3), kview, vview, mask,
                                       1.0 / math.sqrt(head_dim), 0.0, 0.0)
        x = ggml.ggml_add(ctx, x, ggml.ggml_mul_mat(ctx, w(f"blk.{i}.attn_output.weight"),
                                                    ggml.ggml_reshape_2d(ctx, att, hidden, 1)))
        cur = ggml.ggml_mul(ctx, ggml.ggml_rms_norm(ctx, x, eps), w(f"blk.{i}.ffn_norm.weight"))
        mlp = ggml.ggml_swiglu_split(ctx, ggml.ggml_mul_mat(ctx, w(f"blk.{i}.ffn_gate.weight"), cur),
                                     ggml.ggml_mul_mat(ctx, w(f"blk.{i}.ffn_up.weight"), cur))
        x = ggml.ggml_add(ctx, x, ggml.ggml_mul_mat(ctx, w(f"blk.{i}.ffn_down.weight"), mlp))
    x = ggml.ggml_mul(ctx, ggml.ggml_rms_norm(ctx, x, eps), w("output_norm.weight"))
    logits = ggml.ggml_mul_mat(ctx, w("token_embd.weight"), x)
    ggml.ggml_build_forward_expand(graph, logits)

    pool = ggml.ggml_threadpool_new(ctypes.pointer(ggml.ggml_threadpool_params_default(threads)))
    plan = ggml.ggml_graph_plan(graph, threads, pool)
    work = (ctypes.c_uint8 * max(1, plan.work_size))()
    plan.work_data = ctypes.cast(work, ctypes.POINTER(ctypes.c_uint8))
    tok_np, pos_np, row_np = (ggml.utils.to_numpy(t) for t in (tok, pos, row))
    mask_np, logits_np = ggml.utils.to_numpy(mask), ggml.utils.to_numpy(logits)
    mask_np[:] = -np.inf

    def step(token: int, at: int) -> int:
        tok_np[0], pos_np[0], row_np[0] = token, at, at
        mask_np[:, at] = 0  # (numpy's view is [rows, keys]): key `at` is now visible to the query
        if ggml.ggml_graph_compute(graph, ctypes.pointer(plan)) != 0:
            raise RuntimeError("ggml_graph_compute failed")
        return int(logits_np.reshape(-1).argmax())

    def run(ids, new_tokens):
        mask_np[:] = -np.inf
        for p, t in enumerate(ids[:-1]):  # the prompt, one token a step (not timed)
            step(t, p)
        token, out = ids[-1], []
        start = time.perf_counter()
        for p in range(len(ids) - 1, len(ids) - 1 + new_tokens):
            token = step(token, p)
            out.append(token)
        return out, time.perf_counter() - start

    run.keep = (wctx, ctx, pool, work)  # alive as long as the route
    return run, weight_bytes
