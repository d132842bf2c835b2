"""Prompt templates as data: one ``<name>.yaml`` per prompt in this folder.

Each file has three keys: ``version`` (recorded with every LLM call and part of its cache
key, e.g. ``"judge-locomo/v1"``), ``system`` (may be empty: no system message is sent) and
``user``. Placeholders use :class:`string.Template` syntax, ``$name`` or ``${name}``, so
the literal braces of JSON examples need no escaping; ``$$`` is a literal dollar sign.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from string import Template

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridmem_local.errors import PromptError
from hybridmem_local.files.readers import read_yaml_mapping
from hybridmem_local.llm.base import ChatMessage, ChatRole

PROMPTS_DIR = Path(__file__).parent
_NAME = re.compile(r"^[a-z0-9_]+$")


class PromptTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str = Field(min_length=1)
    system: str = ""
    user: str = Field(min_length=1)

    def messages(self, **values: object) -> list[ChatMessage]:
        """The chat messages with every ``$placeholder`` filled from ``values``."""
        messages = []
        parts: tuple[tuple[ChatRole, str], ...] = (("system", self.system), ("user", self.user))
        for role, text in parts:
            if not text.strip():
                continue
            try:
                content = Template(text).substitute({k: str(v) for k, v in values.items()})
            except KeyError as exc:
                raise PromptError(f"prompt {self.name!r}: no value for placeholder ${exc.args[0]}") from exc
            except ValueError as exc:
                raise PromptError(f"prompt {self.name!r}: bad placeholder in {role} text: {exc}") from exc
            messages.append(ChatMessage(role=role, content=content))
        return messages


@cache
def load_prompt(name: str) -> PromptTemplate:
    """Read ``<name>.yaml`` from this folder (cached)."""
    if not _NAME.match(name):
        raise PromptError(f"invalid prompt name {name!r}: use lowercase letters, digits and _")
    path = PROMPTS_DIR / f"{name}.yaml"
    data = read_yaml_mapping(path, "prompt", PromptError)
    try:
        return PromptTemplate(name=name, **data)
    except (ValidationError, TypeError) as exc:
        raise PromptError(f"prompt {path}: {exc}") from exc


def prompt_names() -> list[str]:
    """Every prompt template in this folder; their versions go into eval run keys and manifests."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))
