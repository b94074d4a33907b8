"""Function-calling accuracy on BFCL v4 through `agentkv serve` and llama.cpp's `llama-server --jinja`
on the same GGUF, with the official `openai` client, temperature 0, `tool_choice: "required"`.

The questions, their tools and the answers are the `bfcl-eval` package's (categories live_simple,
multiple and parallel by default), and so is the checker (its AST checker: right function, every
required argument, each value among the accepted ones). Tools are offered as its OpenAI handlers
offer them (`convert_to_tool`: its types mapped to JSON Schema, "." in a name written "_"). Only
its data, its type mappings and its checker are imported: its model handlers (and their SDKs, and
tree-sitter for Java and JavaScript) are not, so the modules that would import them are stood in for.

Each row is one server and settings: agentkv as it serves by default (the JSON style its template
writes calls in, else the model's choice; budget closing on), with compact or spaced JSON forced,
with budget closing off; then llama-server with `--template` (e.g. llama.cpp's
models/templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja for the embedded SmolLM2, whose
own template has no tools) or the GGUF's own (`--agentkv-template` gives agentkv one too: a GGUF
may carry none, where llama-server falls back to ChatML). Printed: accepted calls, replies without a parsable
call (no call, arguments that are not JSON, or a request the server refused), replies cut at
max_tokens, requests refused (their errors on stderr), and the wall time; and, as a diagnostic of
what the answers miss, how many would be right with the calls a reply repeated word for word
dropped (a small model often writes its call again until max_tokens).

    pip install --no-deps bfcl-eval==2026.3.23
    python benchmarks/bfcl.py [--model FILE.gguf] [--llama-server PATH] [--template FILE.jinja]
        [--agentkv-template FILE.jinja]
        [--limit 50] [--categories live_simple,multiple,parallel] [--runs agentkv,compact,spaced,no-closing,llama]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import types
import urllib.request
from collections import defaultdict
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table

RUNS = {  # name -> what the request adds (agentkv's extensions), or None for llama-server
    "agentkv": {}, "compact": {"json_style": "compact"}, "spaced": {"json_style": "spaced"},
    "no-closing": {"budget_closing": False}, "llama": None,
}


def load_bfcl():
    """bfcl-eval's checker and tool conversion, without its model handlers (see the docstring)."""
    for name in ("bfcl_eval.model_handler.parser.java_parser", "bfcl_eval.model_handler.parser.js_parser"):
        stand_in = types.ModuleType(name)  # (tree-sitter parsers of the Java and JavaScript categories)
        stand_in.parse_java_function_call = stand_in.parse_javascript_function_call = None
        sys.modules[name] = stand_in
    registry = types.ModuleType("bfcl_eval.constants.model_config")  # (the handlers' registry, for one flag:
    registry.MODEL_CONFIG_MAPPING = defaultdict(  # names were offered with "." as "_", as its OpenAI handlers do)
        lambda: types.SimpleNamespace(underscore_to_dot=True))
    sys.modules["bfcl_eval.constants.model_config"] = registry
    from bfcl_eval.constants.enums import Language, ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.model_handler.utils import convert_to_tool

    def tools(functions):
        return [{"type": "function", "function": f}
                for f in convert_to_tool(copy.deepcopy(functions), GORILLA_TO_OPENAPI, ModelStyle.OSSMODEL)]

    def check(functions, output, answer, category):
        return ast_checker(functions, output, answer, Language.PYTHON, category, "agentkv")["valid"]

    return tools, check


def questions(category: str, limit: int) -> list[tuple[dict, list]]:
    data = resources.files("bfcl_eval") / "data"
    entries = [json.loads(line) for line in (data / f"BFCL_v4_{category}.json").read_text().splitlines() if line]
    answers = {a["id"]: a["ground_truth"] for a in (json.loads(line) for line in
               (data / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines() if line)}
    return [(e, answers[e["id"]]) for e in entries[:limit]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before it was ready: {proc.args}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not answer {url} within {timeout:.0f} s")


def start(run: str, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if RUNS[run] is None:
        cmd = [args.llama_server, "-m", args.model, "--jinja", "--port", str(port), "-t", str(args.threads),
               "-np", str(args.concurrency), "-c", str(4096 * args.concurrency), "--temp", "0"]
        if args.template:
            cmd += ["--chat-template-file", args.template]
    else:
        agentkv = shutil.which("agentkv") or str(Path(sys.executable).parent / "agentkv")
        cmd = [agentkv, "serve", "--model", args.model, "--port", str(port)]
        if args.agentkv_template:
            cmd += ["--chat-template", args.agentkv_template]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{args.logs}/{run}.log", "w"))
    wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, f"http://127.0.0.1:{port}/v1"


def ask(client, model: str, entry: dict, tools: list, extra: dict | None, max_tokens: int):
    """(the calls as the checker reads them, or None where the reply has no parsable call; cut?;
    the error the server answered with, or None)"""
    import openai

    try:
        reply = client.chat.completions.create(
            model=model, messages=entry["question"][0], tools=tools, tool_choice="required", temperature=0,
            max_tokens=max_tokens, extra_body=extra or None)
    except openai.APIStatusError as e:  # (a request the server refused: no call, and counted apart)
        return None, False, f"{e.status_code} {e.message}"
    choice = reply.choices[0]
    calls = []
    for call in choice.message.tool_calls or []:
        try:
            calls.append({call.function.name: json.loads(call.function.arguments)})
        except json.JSONDecodeError:
            return None, choice.finish_reason == "length", None
    return calls or None, choice.finish_reason == "length", None


def run_one(run: str, args, cases: dict, tools_of, check) -> dict:
    import openai

    proc, base = start(run, args)
    out = {}
    try:
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        for category, items in cases.items():
            def one(item):
                entry, answer = item
                calls, cut, error = ask(client, model, entry, tools_of(entry["function"]), RUNS[run], args.max_tokens)
                if error is not None:
                    print(f"{run} {entry['id']}: {error}", file=sys.stderr)
                ok = calls is not None and check(entry["function"], calls, answer, category)
                # (a diagnostic: the same reply with a call it repeated word for word dropped)
                once = [c for k, c in enumerate(calls or []) if c not in calls[:k]]
                ok_once = bool(once) and check(entry["function"], once, answer, category)
                return ok, calls is None, cut, error is not None, ok_once

            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(one, items))
            out[category] = dict(right=sum(r[0] for r in results), unparsable=sum(r[1] for r in results),
                                 cut=sum(r[2] for r in results), refused=sum(r[3] for r in results),
                                 right_once=sum(r[4] for r in results), n=len(results),
                                 seconds=time.perf_counter() - started)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a GGUF file (default: the embedded SmolLM2)")
    p.add_argument("--llama-server", default=shutil.which("llama-server") or "llama-server")
    p.add_argument("--template", help="llama-server's --chat-template-file (default: the GGUF's template)")
    p.add_argument("--agentkv-template", help="agentkv serve's --chat-template (default: the GGUF's template)")
    p.add_argument("--categories", default="live_simple,multiple,parallel")
    p.add_argument("--runs", default="agentkv,compact,spaced,no-closing,llama")
    p.add_argument("--limit", type=int, default=50, help="questions per category (from the first)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--logs", default=".bfcl-logs", help="the servers' stderr, one file a run")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    if args.model is None:
        from agentkv.engine.loader import embedded_model_path

        args.model = str(embedded_model_path())
    runs = args.runs.split(",")
    if bad := [r for r in runs if r not in RUNS]:
        raise SystemExit(f"unknown runs {bad}; choose from {list(RUNS)}")
    if "llama" in runs and shutil.which(args.llama_server) is None and not Path(args.llama_server).exists():
        raise SystemExit(f"no llama-server at {args.llama_server!r}: build llama.cpp's tools/server (cmake --build "
                         "build --target llama-server) and pass --llama-server, or leave 'llama' out of --runs")
    try:
        tools_of, check = load_bfcl()
    except ImportError as e:
        raise SystemExit(f"bfcl-eval is not installed ({e}): pip install --no-deps bfcl-eval==2026.3.23") from None
    Path(args.logs).mkdir(exist_ok=True)
    cases = {c: questions(c, args.limit) for c in args.categories.split(",")}
    figures = {run: run_one(run, args, cases, tools_of, check) for run in runs}
    rows = []
    for run, cats in figures.items():
        for category, f in cats.items():
            rows.append([run, category, f"{f['right']}/{f['n']}", f"{f['right_once']}/{f['n']}", f["unparsable"],
                         f["cut"], f["refused"], f"{f['seconds']:.1f}"])
    print(f"\n{Path(args.model).name}, {args.limit} questions a category, temperature 0, tool_choice required, "
          f"max_tokens {args.max_tokens}, {args.concurrency} at once")
    print(table(rows, ["run", "category", "right", "right, repeats dropped", "no parsable call", "cut", "refused",
                       "seconds"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
