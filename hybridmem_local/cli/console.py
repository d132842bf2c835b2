"""The two consoles every ``hybridmem`` command prints through: data on stdout, errors on stderr.

Rich wraps text at the console's width, which is 80 columns when the output is not a terminal:
an error written to a log or a pipe would then break mid-sentence. Off a terminal, lines are
printed whole (soft wrap) and left for whatever reads them to wrap; tables keep their layout.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console


class CommandConsole(Console):
    """A rich ``Console`` that hard-wraps messages only when it writes to a terminal."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        # Messages only: soft wrap would also stop a table's cells from wrapping to its columns.
        messages = all(isinstance(obj, str) for obj in objects)
        if messages and kwargs.get("soft_wrap") is None and not self.is_terminal:
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)


console = CommandConsole()
err = CommandConsole(stderr=True)
