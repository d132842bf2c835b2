"""The error tree and the public surface: one root, a stable code per class, one code table, and
``hybridmem_local.__all__`` naming exactly what the package exports."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

import hybridmem_local
from hybridmem_local import errors
from hybridmem_local.errors import (
    ERROR_CODES,
    AskTimeoutError,
    HybridMemError,
    InvalidInputError,
    NotFoundError,
    RateLimitedError,
)
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import check_namespace
from hybridmem_local.weights.resolve import ModelVerificationError
from tests.conftest import REPO


def tree() -> list[type[HybridMemError]]:
    found, todo = [], [HybridMemError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_is_in_errors_py_and_has_a_code_in_the_table():
    classes = tree()
    assert len(classes) >= 28
    for cls in classes:
        # All in errors.py, but for the one that carries a model_registry type.
        assert cls.__module__ == "hybridmem_local.errors" or cls is ModelVerificationError, cls
        assert cls.code in ERROR_CODES, cls
        # The class a client raises for a code is the most general one: every class with that code is one.
        assert issubclass(cls, ERROR_CODES[cls.code].error), cls
    for code, entry in ERROR_CODES.items():
        assert entry.error.code == code
        assert entry.status == entry.error("x").status
    # The documented contract (README, docs/deployment.md).
    assert {code: entry.status for code, entry in ERROR_CODES.items()} == {
        "bad_request": 400,
        "unauthorized": 401,
        "forbidden": 403,
        "not_found": 404,
        "method_not_allowed": 405,
        "conflict": 409,
        "payload_too_large": 413,
        "unsupported_media_type": 415,
        "validation_error": 422,
        "rate_limited": 429,
        "internal": 500,
        "queue_full": 503,
        "not_ready": 503,
        "store_unavailable": 503,
        "timeout": 504,
    }


def test_standard_bases_stay_and_not_found_is_no_key_error():
    missing = NotFoundError("no memory with id 7")
    assert isinstance(missing, LookupError) and not isinstance(missing, KeyError)
    assert str(missing) == missing.message == "no memory with id 7"  # no KeyError quoting
    assert issubclass(InvalidInputError, ValueError) and issubclass(AskTimeoutError, TimeoutError)
    assert issubclass(errors.StoreError, RuntimeError) and issubclass(errors.DuplicateSessionError, errors.StoreError)
    assert RateLimitedError("slow down", retry_after=2.0).retry_after == 2.0
    assert errors.error_text(errors.ForbiddenError("no")) == "forbidden: no"


def test_the_library_raises_named_errors_for_bad_arguments(tmp_path):
    with pytest.raises(InvalidInputError, match="invalid namespace"):
        check_namespace("../etc")
    with HybridMemory.open(tmp_path / "m.db") as memory:
        with pytest.raises(NotFoundError, match="no memory with id 5") as caught:
            memory.get(5)
        assert caught.value.code == "not_found"
        with pytest.raises(InvalidInputError, match="limit and offset must not be negative") as bad:
            memory.list("alice", limit=-1)
        assert bad.value.status == 422


def test_all_lists_exactly_the_public_surface_and_every_name_imports():
    exported = hybridmem_local.__all__
    assert len(exported) == len(set(exported))
    bound = {
        name
        for name, value in vars(hybridmem_local).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    }
    assert set(exported) == bound
    assert {cls.__name__ for cls in tree()} | {"ERROR_CODES", "ErrorCode"} <= set(exported)
    # In a fresh interpreter: every name imports, and importing the package loads no heavy backend.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from hybridmem_local import *\n"
            "import hybridmem_local\n"
            "print(json.dumps({'missing': [n for n in hybridmem_local.__all__ if n not in globals()],"
            " 'heavy': sorted({'torch', 'sentence_transformers', 'llama_cpp', 'fastapi', 'mcp'} & set(sys.modules))}))",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout) == {"missing": [], "heavy": []}
