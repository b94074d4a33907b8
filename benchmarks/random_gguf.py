"""A random-weight Llama GGUF of a given shape, for decode speed out of cache (weights larger than L3).

The file is what llama.cpp's converter writes for a Llama: the embedded SmolLM2's tokenizer and chat
template (so agentkv and llama.cpp read the same prompts), norms of ones, a tied embedding, and every
matrix as random blocks of the asked type: random quant bytes under one small scale per block (Q4_0,
Q8_0), or, for `q4_k_m`, Q4_K with attn_v and ffn_down in Q6_K as llama.cpp's Q4_K_M mix has them.
Speed does not depend on the values; the scales keep activations finite through the layers. The
default shape (hidden 2048, 28 layers, ffn 8192, 32 / 8 heads: 1.8B parameters) is a 1.0 GB Q4_0 file.

`--type mxfp4` writes a gpt-oss instead (llama.cpp's `gpt-oss` architecture, gpt-oss-20b's layer shape:
hidden 2880, 64 query and 8 KV heads of 64, 32 experts of width 2880 of which 4 a token, every other layer
windowed to 128, sinks and biases), its experts in MXFP4 as the published files hold them and the rest
in Q8_0 (the router and vectors in F32), `--layers` of them (default 4: 1.9 GB) and the embedded model's
vocabulary.

`--type gemma4` writes a Gemma 4 of E2B's form (llama.cpp's `gemma4` architecture): every fifth layer full
attention with heads of 512 and a quarter of their pairs rotating (`rope_freqs`), the others windowed to 512
with heads of 256, one KV head, the last `--shared` layers reading earlier layers' KV with an MLP twice as
wide, per-layer inputs 256 wide (their table in Q8_0, as wide as the vocabulary), a scalar a layer; matrices
in Q8_0, `--layers` of them (default 35), `--hidden` 1536 and `--ffn` 6144 unless given, the embedded
model's vocabulary. With `--experts E` it takes 26B-A4B's form instead: `--top-k` of E experts `--expert-ffn`
wide beside each layer's MLP (fused gate/up, the router in F32 with its scale, a scale per expert, the
branches' norms), no per-layer inputs and no shared KV.

    python benchmarks/random_gguf.py OUT.gguf [--type q4_0|q8_0|q4_k_m|mxfp4|gemma4] [--layers 28] [--hidden 2048]
                                    [--ffn 8192] [--shared 20] [--experts 0 --top-k 4 --expert-ffn 512]
    python benchmarks/quantized_decode.py --model OUT.gguf --batches 1 --prompt-tokens 32 --extend 0,0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agentkv.engine.loader import embedded_model_path

Q = gguf.GGMLQuantizationType
# type: (weights a block, bytes a block, byte offsets of fp16 scales set to `scale`, the scale)
BLOCKS = {
    Q.Q4_0: (32, 18, (0,), 0.004),  # d, 16 bytes of nibbles: weights (q - 8) * d
    Q.Q8_0: (32, 34, (0,), 0.0008),  # d, 32 int8
    Q.Q4_K: (256, 144, (0, 2), 0.0001),  # d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
    Q.Q6_K: (256, 210, (208,), 0.00005),  # 128 low nibbles, 64 of high bits, 16 int8 scales, then d
}
MXFP4_EXPONENT = 118  # an MXFP4 block's scale 2^(e - 128): weights up to 12 / 1024


def random_blocks(rows: int, cols: int, qtype, rng) -> np.ndarray:
    """[rows, cols / weights a block * bytes a block] uint8: random quant bytes, each block's scales fixed."""
    per, size, scales, scale = BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    for at in scales:
        blocks[:, :, at : at + 2] = d
    return blocks.reshape(rows, -1)


def add_blocks(w: gguf.GGUFWriter, rng, name: str, shape: tuple[int, ...], kind) -> None:
    """A matrix (or a stack of them: shape [experts, out, in]) of random blocks of `kind` into `w`."""
    data = random_blocks(int(np.prod(shape[:-1])), shape[-1], kind, rng).reshape(*shape[:-1], -1)
    w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)  # (the bytes' shape: gguf reads the weights')


def tokenizer(w: gguf.GGUFWriter) -> int:
    """The embedded model's tokenizer and chat template into `w`; returns the vocabulary's size."""
    src = gguf.GGUFReader(str(embedded_model_path()))

    def field(name):
        return src.fields[name].contents()

    tokens = field("tokenizer.ggml.tokens")
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model(field("tokenizer.ggml.model"))
    w.add_tokenizer_pre(field("tokenizer.ggml.pre"))
    w.add_token_list(tokens)
    w.add_token_types(field("tokenizer.ggml.token_type"))
    w.add_token_merges(field("tokenizer.ggml.merges"))
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))
    w.add_add_bos_token(bool(field("tokenizer.ggml.add_bos_token")))
    w.add_chat_template(field("tokenizer.chat_template"))
    return len(tokens)


def write_gpt_oss(out: str, layers: int, seed: int = 0) -> None:
    """gpt-oss-20b's layers (see the top), experts in MXFP4, the rest in Q8_0."""
    rng = np.random.default_rng(seed)
    hidden, heads, kv_heads, head_dim, experts, used, width = 2880, 64, 8, 64, 32, 4, 2880
    w = gguf.GGUFWriter(out, "gpt-oss")
    w.add_name(f"random gpt-oss {layers} layers mxfp4")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(width)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    w.add_expert_feed_forward_length(width)
    w.add_sliding_window(128)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    vocab = tokenizer(w)

    def matrix(name, shape, kind=Q.Q8_0):
        if kind != Q.MXFP4:
            return add_blocks(w, rng, name, shape, kind)
        # the exponent, then 16 bytes of random codes
        data = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // 32, 17), dtype=np.uint8)
        data[..., 0] = MXFP4_EXPONENT
        data = data.reshape(*shape[:-1], -1)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)

    def vector(name, shape, scale=0.02):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    matrix("token_embd.weight", (vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    matrix("output.weight", (vocab, hidden))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(b + "post_attention_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, rows in (("attn_q", heads * head_dim), ("attn_k", kv_heads * head_dim),
                           ("attn_v", kv_heads * head_dim)):
            matrix(b + name + ".weight", (rows, hidden))
            vector(b + name + ".bias", rows)
        matrix(b + "attn_output.weight", (hidden, heads * head_dim))
        vector(b + "attn_output.bias", hidden)
        vector(b + "attn_sinks.weight", heads, 1.0)
        vector(b + "ffn_gate_inp.weight", (experts, hidden))  # (the router in F32, as llama.cpp's files keep it)
        vector(b + "ffn_gate_inp.bias", experts)
        for name, rows, cols in (("ffn_gate_exps", width, hidden), ("ffn_up_exps", width, hidden),
                                 ("ffn_down_exps", hidden, width)):
            matrix(b + name + ".weight", (experts, rows, cols), Q.MXFP4)
            vector(b + name + ".bias", (experts, rows))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gemma4(out: str, layers: int, hidden: int, ffn: int, shared: int, experts: int = 0, top_k: int = 4,
                 expert_ffn: int = 512, seed: int = 0) -> None:
    """Gemma 4 of E2B's form, or with `experts` 26B-A4B's (see the top), its matrices in Q8_0."""
    rng = np.random.default_rng(seed)
    heads, local_dim, full_dim, width, window = 8, 256, 512, 0 if experts else 256, 512
    shared = 0 if experts else shared
    full = [(i + 1) % 5 == 0 for i in range(layers)]
    w = gguf.GGUFWriter(out, "gemma4")
    w.add_name(f"random gemma4 {layers}x{hidden} q8_0")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length([ffn * (2 if i >= layers - shared else 1) for i in range(layers)])
    w.add_head_count(heads)
    w.add_head_count_kv([1] * layers)
    w.add_key_length(full_dim)
    w.add_value_length(full_dim)
    w.add_key_length_swa(local_dim)
    w.add_value_length_swa(local_dim)
    w.add_rope_dimension_count(full_dim)
    w.add_rope_dimension_count_swa(local_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_rope_freq_base_swa(10_000.0)
    w.add_sliding_window(window)
    w.add_sliding_window_pattern([not f for f in full])
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(width)
    w.add_final_logit_softcapping(30.0)
    w.add_layer_norm_rms_eps(1e-6)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(top_k)
        w.add_expert_feed_forward_length(expert_ffn)
    vocab = tokenizer(w)

    def matrix(name, rows, cols, stack=1):
        add_blocks(w, rng, name, (stack, rows, cols) if stack > 1 else (rows, cols), Q.Q8_0)

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    matrix("token_embd.weight", vocab, hidden)
    if width:
        matrix("per_layer_token_embd.weight", vocab, layers * width)
        matrix("per_layer_model_proj.weight", layers * width, hidden)
        ones("per_layer_proj_norm.weight", width)
    ones("output_norm.weight", hidden)
    turning = full_dim // 8  # (a quarter of the pairs rotate; the rest are marked 1e30, as llama.cpp writes them)
    w.add_tensor("rope_freqs.weight", np.array([1.0] * turning + [1e30] * (full_dim // 2 - turning), np.float32))
    for i in range(layers):
        b, dim, wide = f"blk.{i}.", full_dim if full[i] else local_dim, ffn * (2 if i >= layers - shared else 1)
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "post_norm"):
            ones(b + name + ".weight", hidden)
        ones(b + "attn_q_norm.weight", dim)
        matrix(b + "attn_q.weight", heads * dim, hidden)
        if i < layers - shared:  # (the shared layers read an earlier layer's K/V)
            ones(b + "attn_k_norm.weight", dim)
            matrix(b + "attn_k.weight", dim, hidden)
            matrix(b + "attn_v.weight", dim, hidden)
        matrix(b + "attn_output.weight", hidden, heads * dim)
        matrix(b + "ffn_gate.weight", wide, hidden)
        matrix(b + "ffn_up.weight", wide, hidden)
        matrix(b + "ffn_down.weight", hidden, wide)
        if width:
            matrix(b + "inp_gate.weight", width, hidden)
            matrix(b + "proj.weight", hidden, width)
        if experts:  # (the router in F32, as llama.cpp's quantize keeps it)
            w.add_tensor(b + "ffn_gate_inp.weight", (rng.standard_normal((experts, hidden)) * 0.02).astype(np.float32))
            ones(b + "ffn_gate_inp.scale", hidden)
            ones(b + "ffn_down_exps.scale", experts)
            matrix(b + "ffn_gate_up_exps.weight", 2 * expert_ffn, hidden, experts)
            matrix(b + "ffn_down_exps.weight", hidden, expert_ffn, experts)
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                ones(b + name + ".weight", hidden)
        ones(b + "layer_output_scale.weight", 1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(out: str, qtype: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"random llama {layers}x{hidden} {qtype}")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(100000.0)  # (the embedded SmolLM2's)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    vocab = tokenizer(w)

    main = {"q4_0": Q.Q4_0, "q8_0": Q.Q8_0, "q4_k_m": Q.Q4_K}[qtype]
    heavy = Q.Q6_K if qtype == "q4_k_m" else main  # Q4_K_M's attn_v and ffn_down

    def matrix(name, rows, cols, kind):
        add_blocks(w, rng, name, (rows, cols), kind)

    matrix("token_embd.weight", vocab, hidden, Q.Q8_0 if qtype != "q4_0" else Q.Q4_0)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    head_dim = hidden // heads
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        matrix(b + "attn_q.weight", hidden, hidden, main)
        matrix(b + "attn_k.weight", kv_heads * head_dim, hidden, main)
        matrix(b + "attn_v.weight", kv_heads * head_dim, hidden, heavy)
        matrix(b + "attn_output.weight", hidden, hidden, main)
        matrix(b + "ffn_gate.weight", ffn, hidden, main)
        matrix(b + "ffn_up.weight", ffn, hidden, main)
        matrix(b + "ffn_down.weight", hidden, ffn, heavy)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--type", default="q4_0", choices=["q4_0", "q8_0", "q4_k_m", "mxfp4", "gemma4"])
    ap.add_argument("--layers", type=int, default=None, help="28 (a gpt-oss: 4, a Gemma 4: 35)")
    ap.add_argument("--hidden", type=int, default=None, help="2048 (a Gemma 4: 1536)")
    ap.add_argument("--ffn", type=int, default=None, help="8192 (a Gemma 4: 6144)")
    ap.add_argument("--shared", type=int, default=20, help="a Gemma 4's layers reading earlier layers' KV")
    ap.add_argument("--experts", type=int, default=0, help="a Gemma 4's experts beside each MLP (26B-A4B's form)")
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--expert-ffn", type=int, default=512)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    args = ap.parse_args()
    if args.type == "mxfp4":
        write_gpt_oss(args.out, args.layers or 4)
    elif args.type == "gemma4":
        write_gemma4(args.out, args.layers or 35, args.hidden or 1536, args.ffn or 6144, args.shared, args.experts,
                     args.top_k, args.expert_ffn)
    else:
        write(args.out, args.type, args.layers or 28, args.hidden or 2048, args.ffn or 8192, args.heads,
              args.kv_heads)
    print(f"{args.out}: {Path(args.out).stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
