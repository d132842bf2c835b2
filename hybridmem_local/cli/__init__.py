"""The ``hybridmem`` command: the Python API with flags (``main``: the Typer app and the memory
commands; one module per command group)."""

from hybridmem_local.cli.main import app

__all__ = ["app"]
