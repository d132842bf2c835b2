#!/usr/bin/env python
"""Prepare models for an air-gapped machine without installing the ``hybridmem`` entry point.

The same commands as ``hybridmem models ...`` (the same functions behind them), e.g. on a
machine with internet::

    python scripts/download_models.py download qwen3-8b
    python scripts/download_models.py bundle all-minilm-l6-v2 smollm2-135m-instruct qwen3-8b --out models.tar

and on the air-gapped one::

    python scripts/download_models.py install-bundle models.tar
    python scripts/download_models.py verify

See docs/airgapped.md.
"""

from hybridmem_local.cli.models import app

if __name__ == "__main__":
    app(prog_name="download_models.py")
