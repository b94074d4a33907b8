"""A GGUF file's embedded tokenizer as the tokenizer files an HF directory holds (tokenizer.json,
tokenizer_config.json, generation_config.json's ends): byte-level BPE split as llama.cpp splits each
`tokenizer.ggml.pre`, SentencePiece as a BPE, Gemma 4's "gemma4"; and the tokens llama.cpp ends at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentkv.errors import ModelLoadError

# GGUF `tokenizer.ggml.pre` -> how llama.cpp splits text before BPE (llama-vocab.cpp): "bytelevel" (GPT-2's
# regex), "digits" (each digit apart, then GPT-2's), or regexes applied one after another (each match its
# own piece), the patterns verbatim from the models' own tokenizers (Oniguruma reads (?i:) and && as they do)
_LLAMA3_PAT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # noqa: E501 - the pattern verbatim
_QWEN2_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
# o200k (gpt-oss, Llama 4): a word is its capitals then its small letters, contractions kept with it
_O200K_PAT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTION +
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTION +
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Kimi K2: o200k's with Han characters runs of their own, out of the letter runs
_NOT_HAN_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_NOT_HAN_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_KIMI_PAT = (r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?" + _NOT_HAN_UPPER + "*" + _NOT_HAN_LOWER + "+" + _CONTRACTION +
             r"|[^\r\n\p{L}\p{N}]?" + _NOT_HAN_UPPER + "+" + _NOT_HAN_LOWER + "*" + _CONTRACTION +
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek V3: numbers of up to 3 digits, then CJK runs, then the rest
_DEEPSEEK3_PATS = (r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                   r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                   r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's for a file that names none (or "default"): punctuation runs, GPT-2's, numbers, then 3-digit runs
_DEFAULT_PATS = (r"[\p{P}\$\+<=>\^~\|]+", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                 r"\p{N}+", r"[0-9][0-9][0-9]")
_PRE_TOKENIZERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "default": ("regex", _DEFAULT_PATS),
    "gpt-2": ("bytelevel", ()),
    "smollm": ("digits", ()),
    "starcoder": ("digits", ()),
    "refact": ("digits", ()),
    **{name: ("regex", (_LLAMA3_PAT,)) for name in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "lfm2", "glm4",
                                                   "chatglm-bpe")},
    **{name: ("regex", (_QWEN2_PAT,)) for name in ("qwen2", "deepseek-r1-qwen")},
    **{name: ("regex", (_O200K_PAT,)) for name in ("gpt-4o", "llama4")},
    "kimi-k2": ("regex", (_KIMI_PAT,)),
    "deepseek-v3": ("regex", _DEEPSEEK3_PATS),
}
# llama.cpp takes a whole piece that is a token as that token, whatever the merges (HF's ignore_merges)
_IGNORE_MERGES = ("llama-bpe", "llama3", "llama-v3", "lfm2", "glm4")
TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 2, 3, 4


def tokenizer_files_from_gguf(meta: dict[str, Any], gguf_path: Path, out: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for a GGUF file's embedded tokenizer."""
    from tokenizers import AddedToken

    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
    if kind == "gpt2" and tokens:
        tok = _byte_level_bpe(meta, tokens, gguf_path)
    elif kind == "llama" and tokens:
        tok = _sentencepiece_bpe(meta, tokens)
    elif kind == "gemma4" and tokens:
        tok = _gemma4_bpe(meta, tokens)
    else:
        raise ModelLoadError(
            f"{gguf_path.name}: tokenizer model {kind!r} is not supported; agentkv reads byte-level BPE ('gpt2': "
            "Llama 3, Qwen, SmolLM), SentencePiece ('llama': Llama 2, Mistral v0.1, Phi-3, Gemma) and Gemma 4's "
            "('gemma4') GGUF tokenizers. Use the model's HF directory instead."
        )
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    added = [
        AddedToken(tokens[i], special=types[i] == TOKEN_TYPE_CONTROL, normalized=False)
        for i in range(len(types))
        if types[i] in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    tok.save(str(out / "tokenizer.json"))

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    cfg = {
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False))
    # a turn also ends at the end-of-turn / end-of-message tokens the GGUF names (Gemma's <end_of_turn>), and at
    # those llama.cpp ends generation at by their text (Gemma 4's <turn|>, which its files do not name)
    ends = {int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in ("eos", "eot", "eom")
            if meta.get(f"tokenizer.ggml.{k}_token_id") is not None} | _ends_by_text(tokens)
    if ends:
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": sorted(ends)}))


# the tokens llama.cpp ends generation at by their text (llama-vocab.cpp's end-of-generation list)
_END_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>")


def _ends_by_text(tokens: list[str]) -> set[int]:
    """llama.cpp's end-of-generation tokens found by text, with its exceptions: harmony's and Solar Open's
    <|end|> ends a message, not the turn, where <|return|> and <|call|> (<|calls|> and <|flush|>) are there;
    Gemma 4's </s> is text where <|tool_response> is there."""
    found = {t: i for i, t in enumerate(tokens) if t in _END_TEXTS}
    if "<|end|>" in found and "<|call|>" in found and "<|return|>" in found \
            or "<|end|>" in found and "<|calls|>" in found and "<|flush|>" in found:
        del found["<|end|>"]
    if "<|tool_response>" in found:
        found.pop("</s>", None)
    return set(found.values())


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], gguf_path: Path):
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    pre = meta.get("tokenizer.ggml.pre") or "default"
    if pre not in _PRE_TOKENIZERS:
        raise ModelLoadError(
            f"{gguf_path.name}: pre-tokenizer {pre!r} is not supported; agentkv knows {sorted(_PRE_TOKENIZERS)}. "
            "Use the model's HF directory (with tokenizer.json) instead."
        )
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                 ignore_merges=pre in _IGNORE_MERGES))
    style, patterns = _PRE_TOKENIZERS[pre]
    if style == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif style == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [*(pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str]):
    """llama.cpp's SentencePiece tokenizer ("llama" GGUF vocabularies) as a `tokenizers` BPE.

    llama.cpp writes spaces as `▁` (one more before the text and after each special token, where
    `add_space_prefix`), starts from the text's characters, and merges first the adjacent pair whose
    joined piece has the highest score (the leftmost of equals); a character outside the vocabulary
    is its UTF-8 bytes' `<0xNN>` tokens. The same as a BPE whose merges are every split of a piece
    into two pieces, ranked by the joined piece's score, with byte fallback, as transformers converts
    SentencePiece models. (Pieces of equal score merge by the order of their splits here rather than
    leftmost first: real vocabularies score every piece differently.)"""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers

    scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    types = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens))
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab[t if t not in vocab else f"<agentkv duplicate {i}>"] = i  # (ids are what the model knows)
    pieces = {t: scores[i] for i, t in enumerate(tokens) if types[i] in (TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED)}
    splits = [(score, len(p[:k]), len(p[k:]), p[:k], p[k:]) for p, score in pieces.items()
              for k in range(1, len(p)) if p[:k] in pieces and p[k:] in pieces]
    splits.sort(key=lambda s: (-s[0], -s[1], -s[2]))
    unk = next((tokens[i] for i, ty in enumerate(types) if ty == TOKEN_TYPE_UNKNOWN), None)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in splits], unk_token=unk,
                                 fuse_unk=False, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    spaces = normalizers.Replace(" ", "\u2581")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), spaces]) if prefix else spaces
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _gemma4_bpe(meta: dict[str, Any], tokens: list[str]):
    """llama.cpp's "gemma4" tokenizer (its pre-type gemma4) as a `tokenizers` BPE: spaces written as `▁`
    (none prepended), the text cut into runs of newlines and runs of everything else, each run merged by
    the file's ranked merges over its UTF-8 characters, a character outside the vocabulary its bytes'
    `<0xNN>` tokens. (A merge's two pieces are split at its first space past the first character.)"""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    merges = []
    for m in meta.get("tokenizer.ggml.merges") or []:
        cut = m.find(" ", 1)
        if cut > 0:
            merges.append((m[:cut], m[cut + 1:]))
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab[t if t not in vocab else f"<agentkv duplicate {i}>"] = i  # (ids are what the model knows)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[^\\n]+|[\\n]+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok
