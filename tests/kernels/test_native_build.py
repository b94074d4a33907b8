"""native_build: the fallback flags serve a compiler that refuses the flags (-march=native), never a source
that fails under flags the compiler takes (a fast body's compile error would otherwise leave every kernel
in its plain-C body, many times slower, with every test still passing)."""

from __future__ import annotations

import pytest

from agentkv import native_build

try:
    native_build.compiler()
except RuntimeError:
    pytest.skip("no C compiler here", allow_module_level=True)


def test_a_source_failing_under_taken_flags_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "k.c"
    src.write_text("#ifdef AGENTKV_FAST\nint f(void) { return missing(); }\n#endif\nint g(void) { return 1; }\n")
    with pytest.raises(RuntimeError, match="failed"):
        native_build.build("t", "k", [src], flags=["-DAGENTKV_FAST", "-Werror=implicit-function-declaration"],
                           fallback_flags=[])
    assert native_build.build("t", "k", [src], flags=[], fallback_flags=[]).exists()


def test_flags_the_compiler_refuses_fall_back(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "k.c"
    src.write_text("int g(void) { return 1; }\n")
    assert native_build.build("t", "k", [src], flags=["-mno-such-flag-anywhere"], fallback_flags=[]).exists()
