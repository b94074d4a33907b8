"""`agentkv run`, `agentkv serve`, `agentkv generate` and `agentkv chat`. Options come from typed signatures; errors
exit non-zero with a one-line reason.

Each command imports the library when it runs (and `serve` its web stack, `--replicas` Ray): `agentkv --help` and
a mistyped option answer without the half second `import agentkv` takes."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="agentkv: structured output and agents on an LLM engine that remembers.", no_args_is_help=True)

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)"),
]
MaxTokens = Annotated[int, typer.Option(help="most tokens to generate per reply")]
Temperature = Annotated[float, typer.Option(help="sampling temperature; 0 is greedy")]
# how the engine runs: the same options on every command that makes one (and every --replicas replica)
Device = Annotated[str, typer.Option(help="cpu, cuda, cuda:N, or auto: a CUDA GPU where there is one, else the CPU")]
Dtype = Annotated[str, typer.Option(help="float32, bfloat16, float16, or auto: bfloat16 on a GPU, float32 on the CPU")]
TensorParallel = Annotated[int, typer.Option(help="GPUs (or CPU worker processes) that each hold 1/N of the model")]
ContextLength = Annotated[int | None, typer.Option(help="the longest sequence served (default: the model's)")]
NumSlots = Annotated[int | None, typer.Option(help="KV pool size in tokens (default: from --memory-fraction)")]
MemoryFraction = Annotated[
    float | None,
    typer.Option(help="the share of memory the KV pool may take (default: 0.85 of a GPU's, 0.2 of the free RAM)")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


@app.command()
def run(
    file: Annotated[str, typer.Argument(help="a Python file defining `agent` (an ak.Agent) or a `main` function")],
    input: Annotated[str | None, typer.Option("--input", "-i", help="the agent's input (default: read stdin)")] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", "-a", help="key=value for `main` (repeatable)")] = None,
    model: ModelOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print the output only, no live view")] = False,
    device: Device = "auto", dtype: Dtype = "auto", tensor_parallel: TensorParallel = 1,
    context_length: ContextLength = None, num_slots: NumSlots = None,
    journal: Annotated[str | None, typer.Option(
        help="record the run in this folder (SQLite) so that --resume finishes it after its process ended")] = None,
    run_id: Annotated[str | None, typer.Option(help="the durable run's id (with --journal and --input)")] = None,
    resume: Annotated[str | None, typer.Option(
        help="finish the durable run of this id from --journal: recorded replies and tool results read back, "
             "no tool run twice")] = None,
) -> None:
    """Run FILE's module-level `agent` (an ak.Agent) on --input with a live view of its steps, or,
    without --input, call its `main(**args)`; print the output. --model becomes the engine of
    everything in FILE that names none. With --journal and --run-id the run is durable, and --resume
    finishes it, printing the output as an uninterrupted run does."""
    import importlib.util
    import sys
    from pathlib import Path

    from rich.console import Console

    import agentkv as ak  # here, not at the top: `agentkv --help` answers without loading the library
    from agentkv.cli.live import format_output  # (rich, with the library)

    path = Path(file)
    if not path.is_file():
        raise _fail(f"{file} not found")
    options = _options(device, dtype, tensor_parallel, context_length, num_slots)
    if model is not None or options:
        ak.set_default_engine(_engine(model, **options))
    sys.path.insert(0, str(path.resolve().parent))  # the file's own imports, as `python FILE` has them
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import has it: dataclasses and pickling look the module up there
    try:
        spec.loader.exec_module(module)
    except ak.AgentKVError as e:
        raise _fail(f"{file}: {e}") from None
    except Exception as e:
        raise _fail(f"{file} failed to load: {type(e).__name__}: {e}") from None
    agent, main = getattr(module, "agent", None), getattr(module, "main", None)
    console = Console()
    if (run_id or resume) and not journal:
        raise _fail("--run-id and --resume name a durable run: give --journal DIR too")
    if run_id and resume:
        raise _fail("give --run-id (a new run, with --input) or --resume (an earlier one), not both")
    durable = {"journal": ak.Journal(journal), "run_id": run_id or resume, "resume": bool(resume)} if journal else {}
    if journal and not durable["run_id"]:
        raise _fail("--journal records a durable run: give --run-id ID (or --resume ID)")
    try:
        if isinstance(agent, ak.Agent) and (input is not None or resume or not callable(main)):
            if input is None and not resume:
                if sys.stdin.isatty():
                    raise _fail("give the agent's input with --input TEXT (or on stdin)")
                input = sys.stdin.read()
            output = _run_agent(agent, input, console, quiet, **durable)
        elif callable(main):
            if input is not None:
                raise _fail(f"{file} has no `agent` (an ak.Agent) to give --input to; pass `main` --arg key=value")
            kwargs = {}
            for item in arg or []:
                key, sep, value = item.partition("=")
                if not sep or not key:
                    raise _fail(f"--arg {item!r} is not key=value")
                kwargs[key] = value
            output = main.run(**kwargs) if hasattr(main, "run") else main(**kwargs)
        else:
            raise _fail(f"{file} defines neither `agent` (an ak.Agent) nor a `main` function")
    except ak.AgentKVError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if not quiet:
        console.print()
    console.print(format_output(output), highlight=False, markup=False, soft_wrap=True)


@app.command()
def serve(
    model: ModelOpt = None,
    host: Annotated[str, typer.Option(help="address to bind; loopback unless you mean to expose it")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    api_key: Annotated[str | None, typer.Option(help="require `Authorization: Bearer KEY` on /v1 routes")] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="the model id clients send (default: from the path)")] = None,
    max_inflight: Annotated[int, typer.Option(help="requests accepted at once; more get HTTP 429")] = 256,
    replicas: Annotated[
        int, typer.Option(help="engine replicas on Ray Serve, with cache-aware routing between them")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="join this Ray cluster (default: start a local one)")] = None,
    open_objects: Annotated[
        bool,
        typer.Option(
            help="let schemas' objects take undeclared keys where they leave "
            "additionalProperties unset (default: closed)"
        ),
    ] = False,
    tool_format: Annotated[
        str | None,
        typer.Option(
            help="the model's tool-call format: hermes, llama3_json, mistral, mistral_args, "
            "pythonic, qwen3_xml, glm, kimi_k2, deepseek_v3, deepseek_v31, granite, phi4_mini, harmony, gemma4 or "
            "functiongemma (default: detected from the chat template)"
        ),
    ] = None,
    chat_template: Annotated[str | None, typer.Option(
        help="a Jinja chat template file used instead of the model's own (a GGUF may carry none)")] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    tensor_parallel: TensorParallel = 1,
    context_length: ContextLength = None,
    num_slots: NumSlots = None,
    memory_fraction: MemoryFraction = None,
    speculative: Annotated[
        str | None,
        typer.Option(
            help="speculative decoding: ngram (drafts from each request's "
            "own tokens: for replies that repeat their context)"
        ),
    ] = None,
    kv_dir: Annotated[str | None, typer.Option(
        help="keep evicted and pinned KV in this folder and read it back instead of recomputing, also after "
             "a restart")] = None,
    kv_disk_size: Annotated[str, typer.Option(help="the most the --kv-dir tier holds, e.g. 20GB or 512MiB")] = "10GiB",
    state_dir: Annotated[str | None, typer.Option(
        help="keep stored /v1/responses in this folder (SQLite), so previous_response_id works across a "
             "restart")] = None,
    kv_flush_timeout: Annotated[float, typer.Option(
        help="on SIGTERM / SIGINT, seconds spent writing the KV pool to --kv-dir (the most recently used "
             "prefixes first) before the server exits")] = 5.0,
    kv_dtype: Annotated[str | None, typer.Option(
        help="the KV pool's dtype: float32, bfloat16 or float16 (default: the model's); bfloat16 on the CPU "
             "halves the pool and what decode's attention reads")] = None,
    lora: Annotated[list[str] | None, typer.Option(
        help="NAME=PATH: serve a LoRA adapter (a PEFT folder or a GGUF LoRA file) as model NAME (repeatable)")] = None,
    max_loras: Annotated[int, typer.Option(help="the most LoRA adapters loaded at once")] = 8,
    allow_runtime_lora: Annotated[bool, typer.Option(
        help="open POST /v1/load_lora_adapter and /v1/unload_lora_adapter")] = False,
) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /v1/pins, /health,
    /metrics) on one engine, or on --replicas engines behind a cache-aware router (Ray Serve). With --lora,
    each adapter is a model of its own (`model` names it), its KV cached apart."""
    from pathlib import Path

    import uvicorn

    from agentkv.server import create_app  # here: the web stack loads with it

    name = served_model_name or (Path(model).stem if model else "SmolLM2-135M-Instruct")
    options = _options(device, dtype, tensor_parallel, context_length, num_slots, memory_fraction=memory_fraction,
                       speculative=speculative, kv_dtype=kv_dtype,
                       **({"tool_format": tool_format} if tool_format else {}),
                       **({"chat_template": chat_template} if chat_template else {}))
    if lora or max_loras != 8:  # (the engine's default otherwise)
        options.update(lora=_pairs(lora or [], "--lora"), max_loras=max_loras)
    if replicas < 1:
        raise _fail(f"--replicas must be at least 1, got {replicas}")
    if state_dir is not None and replicas > 1:
        raise _fail("--state-dir keeps one engine's stored responses; leave it out with --replicas")
    if kv_dir is not None:
        if replicas > 1:
            raise _fail("--kv-dir serves one engine; with --replicas each replica's tier would need its own "
                        "folder, which is not built yet: leave one of them out")
        options.update(kv_dir=kv_dir, kv_disk_bytes=_size(kv_disk_size, "--kv-disk-size"),
                       kv_flush_timeout=kv_flush_timeout)
    if replicas > 1 or ray_address is not None:
        try:
            from agentkv.server.cluster.deploy import serve_cluster  # here: Ray loads with it
        except ImportError as e:
            raise _fail(f"--replicas needs Ray Serve ({e}); install it with pip install 'agentkv[cluster]'") from None
        typer.echo(
            f"agentkv: serving {name!r} on http://{host}:{port}/v1 with {replicas} replicas (Ray Serve)", err=True)
        serve_cluster(model, name, replicas, host, port, api_key, ray_address, engine_options=options,
                      close_objects=not open_objects, max_inflight=max_inflight)
        return
    engine = _engine(model, **options)
    _freeze_heap()
    typer.echo(f"agentkv: serving {name!r} on http://{host}:{port}/v1 ({engine.config.device}, {engine.config.dtype})",
               err=True)
    try:
        # (the app closes the engine as it shuts down: uvicorn re-raises SIGTERM / SIGINT after that, and the
        # process ends before anything after `run` would)
        uvicorn.run(create_app(engine, name, api_key, max_inflight, close_objects=not open_objects, owns_engine=True,
                               state_dir=state_dir, allow_runtime_lora=allow_runtime_lora), host=host, port=port,
                    log_level="warning")
    finally:
        engine.close()


def _run_agent(agent, input: str | None, console, quiet: bool, **durable):
    """The agent's output, with the live view of its steps unless quiet (`durable`: journal, run_id, resume)."""
    from rich.live import Live

    import agentkv as ak  # here, not at the top: `agentkv --help` answers without loading the library
    from agentkv.cli.live import AgentView  # (rich, with the library)

    if quiet:
        if durable.get("resume"):
            return agent.resume_sync(durable["run_id"], journal=durable["journal"]).output
        return agent.run_sync(input, **{k: v for k, v in durable.items() if k != "resume"}).output
    view = AgentView()
    with Live(view.render(), console=console, refresh_per_second=8) as live:
        for event in agent.stream_sync(input, **durable):
            view.update(event)
            live.update(view.render())
            if isinstance(event, ak.RunEnd):
                return event.result.output
    raise AssertionError("an agent's stream ends with RunEnd")  # pragma: no cover


def _freeze_heap() -> None:
    """A server's long-lived objects (the model, the engine, imported modules) out of the garbage
    collector's sight: a full collection over them stalls the engine thread for tens of ms. Only
    the server does this; a library must not freeze its caller's heap."""
    import gc

    gc.collect()
    gc.freeze()


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}


def _size(text: str, option: str) -> int:
    """'20GB', '512MiB', '1.5GiB' or a number of bytes -> bytes."""
    number = text.strip().upper().rstrip("BIKMGT") or "x"
    unit = text.strip().upper()[len(number):]
    try:
        return int(float(number) * _UNITS[unit])
    except (ValueError, KeyError):
        raise _fail(f"{option} {text!r} is not a size; write e.g. 20GB, 512MiB or a number of bytes") from None


def _pairs(items: list[str], option: str) -> dict[str, str]:
    """NAME=VALUE options -> {NAME: VALUE}."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not value:
            raise _fail(f"{option} {item!r} is not NAME=PATH; write e.g. {option} support=./adapters/support")
        out[name] = value
    return out


def _options(device: str = "auto", dtype: str = "auto", tensor_parallel: int = 1, context_length: int | None = None,
             num_slots: int | None = None, **more) -> dict:
    """Engine(...) options from the command line, leaving out what is the engine's default."""
    given = {"device": device, "dtype": dtype, "tensor_parallel": tensor_parallel, "context_length": context_length,
             "num_slots": num_slots, **more}
    defaults = {"device": "auto", "dtype": "auto", "tensor_parallel": 1}
    return {k: v for k, v in given.items() if v is not None and defaults.get(k) != v}


def _engine(model: str | None, **options):
    import agentkv as ak  # here, not at the top: `agentkv --help` answers without loading the library

    try:
        return ak.Engine(model, **options)
    except ak.AgentKVError as e:
        raise _fail(str(e)) from None


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt text (no chat template)")],
    model: ModelOpt = None,
    max_tokens: MaxTokens = 128,
    temperature: Temperature = 0.0,
    schema: Annotated[
        str | None, typer.Option(help="a JSON Schema file (or inline JSON) the output must match")] = None,
    regex: Annotated[str | None, typer.Option(help="a regex the whole output must match")] = None,
    grammar: Annotated[str | None, typer.Option(help="a Lark grammar file the output must match")] = None,
    device: Device = "auto", dtype: Dtype = "auto", tensor_parallel: TensorParallel = 1,
    context_length: ContextLength = None, num_slots: NumSlots = None,
) -> None:
    """Complete a plain-text prompt and print the completion (constrained by --schema, --regex or --grammar)."""
    import json
    from pathlib import Path

    import agentkv as ak  # here, not at the top: `agentkv --help` answers without loading the library

    def read(value: str | None) -> str | None:
        return Path(value).read_text() if value is not None and Path(value).is_file() else value

    try:
        structured = {"json_schema": json.loads(read(schema)) if schema else None, "regex": regex,
                      "grammar": read(grammar)}
    except (json.JSONDecodeError, OSError) as e:
        typer.echo(f"error: --schema is neither a readable file nor JSON: {e}", err=True)
        raise typer.Exit(1) from None
    engine = _engine(model, **_options(device, dtype, tensor_parallel, context_length, num_slots))
    try:
        out = engine.generate(prompt, max_tokens=max_tokens, temperature=temperature, **structured)
        _ = out.parsed  # with a schema, regex or grammar: IncompleteOutputError for an output cut short
    except ak.AgentKVError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    finally:
        engine.close()
    typer.echo(out.text)


@app.command("why-miss")
def why_miss(
    before: Annotated[str, typer.Argument(help="a JSON file: a chat request (messages, tools) or a list of messages")],
    after: Annotated[str, typer.Argument(help="the same for the request that followed it")],
    model: ModelOpt = None,
) -> None:
    """Say where AFTER's prompt parts from BEFORE's (what BEFORE left in the cache) and in which message
    and section: a timestamp in the system prompt, tools in another order, an edited or stripped turn."""
    import json
    from pathlib import Path

    def read(path: str) -> tuple[list, list | None]:
        try:
            body = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise _fail(f"{path}: not a readable JSON file ({e})") from None
        return (body, None) if isinstance(body, list) else (body.get("messages") or [], body.get("tools"))

    (old, tools), (new, new_tools) = read(before), read(after)
    engine = _engine(model)
    try:
        miss = engine.explain_miss(old, new, tools=tools, after_tools=new_tools)
    finally:
        engine.close()
    if miss is None:
        typer.echo("no miss: the second prompt starts with all of the first")
        return
    typer.echo(json.dumps(miss, ensure_ascii=False, indent=2))


@app.command()
def chat(
    model: ModelOpt = None,
    system: Annotated[str | None, typer.Option(help="system prompt")] = None,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.7,
    device: Device = "auto", dtype: Dtype = "auto", tensor_parallel: TensorParallel = 1,
    context_length: ContextLength = None, num_slots: NumSlots = None,
) -> None:
    """Chat with a model in the terminal; earlier turns are served from the radix cache."""
    import asyncio

    from rich.console import Console

    import agentkv as ak  # here, not at the top: `agentkv --help` answers without loading the library

    console = Console()
    engine = _engine(model, **_options(device, dtype, tensor_parallel, context_length, num_slots))
    messages = [{"role": "system", "content": system}] if system else []
    console.print("[dim]agentkv chat: empty line or Ctrl-D to quit[/dim]")

    async def reply() -> str:
        text = ""
        async for delta in engine.stream(messages, max_tokens=max_tokens, temperature=temperature):
            console.print(delta.text, end="", soft_wrap=True, highlight=False, markup=False)
            text += delta.text
        console.print()
        return text

    try:
        while True:
            try:
                user = console.input("[bold green]you> [/bold green]")
            except EOFError:
                break
            if not user.strip():
                break
            messages.append({"role": "user", "content": user})
            try:
                messages.append({"role": "assistant", "content": asyncio.run(reply())})
            except ak.AgentKVError as e:
                console.print(f"[red]error:[/red] {e}")
                messages.pop()
        st = engine.stats()
        console.print(f"[dim]cache hit rate {st['cache_hit_rate']:.0%}, {st['forward_passes']} forward passes[/dim]")
    finally:
        engine.close()


if __name__ == "__main__":
    app()
