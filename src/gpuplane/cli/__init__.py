"""Typer commands, one module per group: parse, call the library, print."""
