#!/usr/bin/env bash
# The Python packages a lent GPU's image lacks, as wheels in .whl/ (ignored by git) to carry there with the
# tree (the tool's `carry: [".whl"]`; under 64 MiB together): the versions this checkout's .venv runs, for
# the image's CPython 3.12 on manylinux x86_64. benchmarks/gpu.sh installs them first where .whl/ exists.
#   bash benchmarks/gpu_wheels.sh      # here, after `make install`; PyPI is reached by name (about 10 MB)
# FlashInfer cannot travel: flashinfer-python's wheel is 101 MB (0.7.4; no release before 0.5 is on PyPI),
# beside cuda-python, apache-tvm-ffi and nvidia-cutlass-dsl, against the 64 MiB a call carries.
# The image's list (KINDS.md of the device tool) has torch, triton, numpy, safetensors, tokenizers, jinja2,
# typer, rich, regex, pyyaml, attrs, tqdm and pytest; what agentkv imports beyond them is named below.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
names=(pydantic pydantic-core annotated-types typing-inspection typing-extensions jsonschema
       jsonschema-specifications referencing rpds-py jsonschema-rs lark gguf crc32c)
rm -rf .whl && mkdir .whl
for name in "${names[@]}"; do
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null || true)
    spec=$name${version:+==$version}
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64 \
        -d .whl "$spec" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
done
ls -1 .whl
du -sh .whl
