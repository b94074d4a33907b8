"""A model's memory at load: the process's resident set once `Engine(model)` returns, and its peak during the
load (sampled every 20 ms), beside the weights' bytes. Run it twice for a GGUF: the first run converts the
file (engine/gguf_convert.py), the second loads the cached conversion, as every later start does.

    python benchmarks/load_memory.py [MODEL]          (default: the embedded SmolLM2-135M-Instruct Q4_1)

A larger file: benchmarks/random_gguf.py writes one (`--type gemma4`: 2.4 GiB).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import agentkv as ak


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    proc, peak = psutil.Process(), [0]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    start = time.perf_counter()
    engine = ak.Engine(model, num_slots=1024)
    took = time.perf_counter() - start
    time.sleep(0.1)
    weights = engine.stats()["weight_bytes"]
    print(f"{model or 'embedded'}: weights {weights / 2**30:.2f} GiB, resident after load "
          f"{proc.memory_info().rss / 2**30:.2f} GiB, peak {peak[0] / 2**30:.2f} GiB, load {took:.1f} s")
    engine.close()


if __name__ == "__main__":
    main()
