"""A random-weight Llama GGUF of a given shape, for decode speed out of cache (weights larger than L3).

The file is what llama.cpp's converter writes for a Llama: the embedded SmolLM2's tokenizer and chat
template (so agentkv and llama.cpp read the same prompts), norms of ones, a tied embedding, and every
matrix as random blocks of the asked type: random quant bytes under one small scale per block (Q4_0,
Q8_0), or, for `q4_k_m`, Q4_K with attn_v and ffn_down in Q6_K as llama.cpp's Q4_K_M mix has them.
Speed does not depend on the values; the scales keep activations finite through the layers. The
default shape (hidden 2048, 28 layers, ffn 8192, 32 / 8 heads: 1.8B parameters) is a 1.0 GB Q4_0 file.

    python benchmarks/random_gguf.py OUT.gguf [--type q4_0|q8_0|q4_k_m] [--layers 28] [--hidden 2048] [--ffn 8192]
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


def random_blocks(rows: int, cols: int, qtype, rng) -> np.ndarray:
    """[rows, cols / weights a block * bytes a block] uint8: random quant bytes, each block's scales fixed."""
    per, size, scales, scale = BLOCKS[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // per, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    for at in scales:
        blocks[:, :, at : at + 2] = d
    return blocks.reshape(rows, -1)


def write(out: str, qtype: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    src = gguf.GGUFReader(str(embedded_model_path()))

    def field(name):
        return src.fields[name].contents()

    tokens = field("tokenizer.ggml.tokens")
    w = gguf.GGUFWriter(out, "llama")
    w.add_name(f"random llama {layers}x{hidden} {qtype}")
    w.add_block_count(layers)
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(field("llama.rope.freq_base")))
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
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

    main = {"q4_0": Q.Q4_0, "q8_0": Q.Q8_0, "q4_k_m": Q.Q4_K}[qtype]
    heavy = Q.Q6_K if qtype == "q4_k_m" else main  # Q4_K_M's attn_v and ffn_down

    def matrix(name, rows, cols, kind):
        data = random_blocks(rows, cols, kind, rng)
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)  # (the bytes' shape: gguf reads the weights')

    matrix("token_embd.weight", len(tokens), hidden, Q.Q8_0 if qtype != "q4_0" else Q.Q4_0)
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
    ap.add_argument("--type", default="q4_0", choices=["q4_0", "q8_0", "q4_k_m"])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    args = ap.parse_args()
    write(args.out, args.type, args.layers, args.hidden, args.ffn, args.heads, args.kv_heads)
    print(f"{args.out}: {Path(args.out).stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
