"""`agentkv generate` and `agentkv chat`. Options come from typed signatures; errors exit non-zero
with a one-line reason."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="agentkv: structured output and agents on an LLM engine that remembers.", no_args_is_help=True)

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")]
MaxTokens = Annotated[int, typer.Option(help="most tokens to generate per reply")]
Temperature = Annotated[float, typer.Option(help="sampling temperature; 0 is greedy")]


def _engine(model: str | None):
    import agentkv as ak

    try:
        return ak.Engine(model)
    except ak.AgentKVError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="the prompt text (no chat template)")],
    model: ModelOpt = None,
    max_tokens: MaxTokens = 128,
    temperature: Temperature = 0.0,
    schema: Annotated[str | None, typer.Option(help="a JSON Schema file (or inline JSON) the output must match")] = None,
    regex: Annotated[str | None, typer.Option(help="a regex the whole output must match")] = None,
    grammar: Annotated[str | None, typer.Option(help="a Lark grammar file the output must match")] = None,
) -> None:
    """Complete a plain-text prompt and print the completion (constrained by --schema, --regex or --grammar)."""
    import json
    from pathlib import Path

    import agentkv as ak

    def read(value: str | None) -> str | None:
        return Path(value).read_text() if value is not None and Path(value).is_file() else value

    try:
        structured = {"json_schema": json.loads(read(schema)) if schema else None, "regex": regex, "grammar": read(grammar)}
    except (json.JSONDecodeError, OSError) as e:
        typer.echo(f"error: --schema is neither a readable file nor JSON: {e}", err=True)
        raise typer.Exit(1) from None
    engine = _engine(model)
    try:
        out = engine.generate(prompt, max_tokens=max_tokens, temperature=temperature, **structured)
        _ = out.parsed  # with a schema, regex or grammar: IncompleteOutputError for an output cut short
    except ak.AgentKVError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    finally:
        engine.close()
    typer.echo(out.text)


@app.command()
def chat(
    model: ModelOpt = None,
    system: Annotated[str | None, typer.Option(help="system prompt")] = None,
    max_tokens: MaxTokens = 256,
    temperature: Temperature = 0.7,
) -> None:
    """Chat with a model in the terminal; earlier turns are served from the radix cache."""
    import asyncio

    from rich.console import Console

    import agentkv as ak

    console = Console()
    engine = _engine(model)
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
