"""The grammar's native code, built on first use and loaded with ctypes: the token walk
(csrc/token_walk.c), the mask cache (csrc/mask_cache.c), the rule automata (csrc/nfa_build.c,
dfa_build.c, dfa_minimize.c),
the linked automaton's live states (csrc/trim.c) and the walk's per-state tables (csrc/state_tables.c).
Where Python's headers are, `expr_module()` also builds csrc/ext/expr_module.c, a CPython extension that
reads a rule's expression objects itself (dfa_native.expression encodes them in Python without it).

Portable C (no -march, no OpenMP, no torch), cached in `$AGENTKV_CACHE_DIR/grammar/` by source and
compiler (native_build.py). Without a C compiler, or with `AGENTKV_NATIVE_GRAMMAR=0`, `load()` returns
None and the Python twins run (tokens/walk.py, automata/dfa_python.py): the same languages and masks, slower.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import sys
import sysconfig
from pathlib import Path

from agentkv import native_build
from agentkv.env import native_grammar_allowed

log = logging.getLogger(__name__)

_CSRC = Path(__file__).resolve().parent / "csrc"
_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64


class GrammarStruct(ctypes.Structure):
    """token_walk.c's Grammar."""
    _fields_ = [("trans", _P), ("fork", _P), ("accept", _P), ("has_bytes", _P), ("tail", _P), ("text_reach", _P),
                ("class_bytes", _P), ("class_reach", _P), ("class_wide", _P), ("call_off", _P), ("call_rule", _P),
                ("call_ret", _P), ("starts", _P), ("n_states", _I32), ("max_depth", _I32), ("variable_rule", _I32)]


class TrieStruct(ctypes.Structure):
    """token_walk.c's Trie."""

    _fields_ = [("byte", _P), ("next", _P), ("depth", _P), ("tok", _P), ("n_end", _P), ("text_chars", _P),
                ("root_chars", _P), ("plain_masks", _P), ("below_bytes", _P), ("depth_below", _P), ("wide_below", _P),
                ("sorted_ids", _P), ("root_child", _P),
                ("n_nodes", _I32), ("max_len", _I32), ("words", _I32)]


class DfaStruct(ctypes.Structure):
    """dfa.h's agentkv_dfa."""

    _fields_ = [("n", _I32), ("n_calls", _I32), ("error", _I32), ("table", _P), ("accept", _P), ("calls", _P),
                ("k", _I32), ("ctab", _P), ("class_of", ctypes.c_uint8 * 256)]


DFA_TOO_MANY, DFA_NO_MEMORY, DFA_TIMEOUT, DFA_TOO_MANY_NFA = 1, 2, 3, 4


def load() -> ctypes.CDLL | None:
    """The library, or None where it is turned off or cannot be built (`unavailable_reason()`)."""
    return _load()[0]


def unavailable_reason() -> str:
    return _load()[1]


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    if not native_grammar_allowed():
        return None, "AGENTKV_NATIVE_GRAMMAR=0 turned the native token walk off"
    try:
        lib = ctypes.CDLL(str(native_build.build("grammar", "agentkv-grammar", sorted(_CSRC.glob("*.c")))))
    except (OSError, RuntimeError) as e:
        log.warning("agentkv: native token walk unavailable, walking in Python (%s)", e)
        return None, str(e)
    lib.agentkv_token_walk.argtypes = [ctypes.POINTER(GrammarStruct), ctypes.POINTER(TrieStruct), _P, _I32, _I32,
                                       _P, _I32, _P, _P, _P, _P, _P]
    lib.agentkv_token_walk.restype = ctypes.c_int
    lib.agentkv_walks_new.argtypes = [ctypes.POINTER(GrammarStruct), ctypes.POINTER(TrieStruct), _I32, _I64, _P]
    lib.agentkv_walks_new.restype = _P
    lib.agentkv_store_new.argtypes = [_I32, _I32, _I64]
    lib.agentkv_store_new.restype = _P
    lib.agentkv_store_free.argtypes = [_P]
    lib.agentkv_store_free.restype = None
    lib.agentkv_store_stats.argtypes = [_P, _P]
    lib.agentkv_store_stats.restype = None
    lib.agentkv_walks_free.argtypes = [_P]
    lib.agentkv_walks_free.restype = None
    lib.agentkv_walks_mask.argtypes = [_P, _P, _P, _I32, _P]
    lib.agentkv_walks_mask.restype = ctypes.c_int
    lib.agentkv_walks_past.argtypes = [_P, _P, _P, _I32, _I32, _I32, _P]
    lib.agentkv_walks_past.restype = ctypes.c_int
    lib.agentkv_walks_clear.argtypes = [_P]
    lib.agentkv_walks_clear.restype = None
    lib.agentkv_walks_stats.argtypes = [_P, _P]
    lib.agentkv_walks_stats.restype = None
    lib.agentkv_expr_to_dfa.argtypes = [_P, _I32, _P, _P, _P, _I32, _I32, ctypes.c_double]
    lib.agentkv_expr_to_dfa.restype = _P
    lib.agentkv_dfa_product.argtypes = [_I32, _P, _P, _I32, _P, _P, _I32, _I32, ctypes.c_double]
    lib.agentkv_dfa_product.restype = _P
    lib.agentkv_dfa_minimize.argtypes = [_I32, _P, _P]
    lib.agentkv_dfa_minimize.restype = _P
    lib.agentkv_trim.argtypes = [_I32, _P, _P, _I32, _P, _P, _P, _P, _P, _P, _P]
    lib.agentkv_trim.restype = ctypes.c_int
    lib.agentkv_dfa_free.argtypes = [_P]
    lib.agentkv_dfa_free.restype = None
    lib.agentkv_state_tables.argtypes = [_I32, _P, _I32, _I32, _P, _P, _I32, _P, _P, _I32, _P, _P, _P, _P]
    lib.agentkv_state_tables.restype = ctypes.c_int
    return lib, ""


def expr_module():
    """The extension module of csrc/ext/expr_module.c (with the rule-automaton sources linked in), or
    None where the native grammar is off or Python's headers or a compiler are missing."""
    return _expr_module()[0]


@functools.cache
def _expr_module() -> tuple[object | None, str]:
    if load() is None:
        return None, unavailable_reason()
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        return None, f"Python's headers are not installed (no Python.h in {include})"
    sources = [_CSRC / "ext" / "expr_module.c", *(_CSRC / f for f in ("nfa_build.c", "dfa_build.c", "dfa_minimize.c"))]
    try:
        path = native_build.build("grammar", "agentkv-expr", sources, flags=[f"-I{include}"],
                                  key=[sys.implementation.cache_tag.encode(), include.encode()])
        spec = importlib.util.spec_from_file_location("agentkv_expr", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, RuntimeError, ImportError) as e:
        log.info("agentkv: rule expressions encoded in Python (%s)", e)
        return None, str(e)
    return module, ""
