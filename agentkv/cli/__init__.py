"""The `agentkv` command line, a thin typer app over the library."""
