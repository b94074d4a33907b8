#!/usr/bin/env bash
# Everything agentkv checks and times on a lent GPU, in one call and without network (< 8 minutes):
#   1. the kernel tests (test_triton_kernels.py, test_attention.py, test_triton_fused.py: norms, activation and
#      rotation fused, test_flashinfer_backend.py, test_triton_lora.py: the LoRA kernels; their slots test needs
#      peft), not interpreted,
#      and the engine on the GPU (test_gpu_engine.py: CUDA graphs + overlap vs eager, sampling, grammars);
#   2. benchmarks/gpu_kernels.py: Triton (grouped and per-head decode) vs the torch backend vs FlashInfer, and
#      --sweep: the grouped decode's tile widths, warps, stages and split counts (data for its defaults);
#   3. benchmarks/gpu_profile.py: one decode step of the Llama shape taken apart (host phases, device busy
#      time, the gaps, the heaviest kernels, runtime calls), eager, with graphs + overlap, and with the fused ops;
#   4. benchmarks/gpu_engine.py: the full Llama-3-8B and Qwen3-8B shapes (random weights drawn on the device),
#      decode at batch 1 / 64 / 16 / 256, prefill of 8k and 512 tokens, agent sessions, eager-vs-graphs
#      parity, each row beside its bound (HBM bandwidth for decode, dense bf16 peak for prefill).
# Each step writes its rows as it goes, so one that runs out of time keeps the ones before.
# Run from the repository root:  bash benchmarks/gpu.sh   (results in $OUT, default /tmp/agentkv-gpu).
# The device image has torch, triton, numpy, tokenizers, safetensors, jinja2 and pytest. The project is
# used from the tree (PYTHONPATH); its other imports (pydantic and its parts, jsonschema and its parts,
# lark, gguf, crc32c) travel as wheels: `bash benchmarks/gpu_wheels.sh` here fills .whl/, the device call
# carries it (carry: [".whl"]) and this script installs it first. No model travels: every model here is
# a config whose weights are drawn on the device.
#   bash benchmarks/gpu.sh --smoke   (on CPU: every step in its smoke mode, the kernels interpreted; the suite
#                                     runs it, tests/test_gpu_scripts.py)
set -uo pipefail
OUT=${OUT:-/tmp/agentkv-gpu}
PY=${PYTHON:-python3}
SMOKE=${1:-}
mkdir -p "$OUT"
if [[ -z "$SMOKE" ]] && compgen -G ".whl/*.whl" > /dev/null; then  # benchmarks/gpu_wheels.sh's, carried along
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/agentkv-site \
        .whl/*.whl && export PYTHONPATH="/tmp/agentkv-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$SMOKE" == "--smoke" ]]; then
    export TRITON_INTERPRET=1
else
    unset TRITON_INTERPRET
fi
summary="$OUT/summary.md"
{
    echo "# agentkv GPU run, $(date -u +%F)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1
    $PY -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.version.cuda)" 2>&1
    $PY -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1
} > "$summary"

# every step's output in one log (a device call brings back 8 files at most: summary, run.log, four tables)
log="$OUT/run.log"
: > "$log"
step() {  # name, seconds, command...
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    echo "## $name: $*" >> "$log"
    timeout "$limit" "$@" > "$OUT/.step" 2>&1
    local rc=$?
    cat "$OUT/.step" >> "$log"
    echo "- $name: rc=$rc, $((SECONDS - t0)) s" >> "$summary"
}

if [[ "$SMOKE" == "--smoke" ]]; then  # (the kernel tests run interpreted in the suite itself)
    step kernel-tests 90 $PY -m pytest -q -p no:cacheprovider tests/engine/test_gpu_engine.py
else
    step kernel-tests 90 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_triton_kernels.py \
        tests/kernels/test_attention.py tests/kernels/test_triton_fused.py tests/kernels/test_flashinfer_backend.py \
        tests/kernels/test_triton_lora.py tests/engine/test_gpu_engine.py
fi
tail -3 "$OUT/.step" >> "$summary"
step kernels 60 $PY benchmarks/gpu_kernels.py $SMOKE --out "$OUT/kernels.md"
step sweep 40 $PY benchmarks/gpu_kernels.py --sweep $SMOKE --out "$OUT/sweep.md"
step profile 100 $PY benchmarks/gpu_profile.py $SMOKE --out "$OUT/profile.md"
step engine 180 $PY benchmarks/gpu_engine.py $SMOKE --out "$OUT/engine.md"
rm -f "$OUT/.step"
cat "$summary" "$OUT"/kernels.md "$OUT"/sweep.md "$OUT"/profile.md "$OUT"/engine.md 2>/dev/null
