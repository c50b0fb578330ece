"""What is wrong with a trace input: :class:`TraceProblem` (one, at a position) and
:class:`TraceError` (the error raised, listing the first problems)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

_SHOWN_CHARS: Final = 80


@dataclass(frozen=True, slots=True)
class TraceProblem:
    """One thing wrong with a trace input, at a position.

    ``line`` is 1-based (header = 1) or ``None`` for a whole-file problem; ``column`` is the
    header name or ``None`` for a whole row or file; ``value`` is the text received (``None``
    when there is none); ``reason`` says what is wrong and ``accepted`` what would be valid.
    """

    line: int | None
    column: str | None
    value: str | None
    reason: str
    accepted: str | None = None

    def render(self, path: Path) -> str:
        """``<path>:<line>: column <c>: value '<v>' <reason>; accepted: <accepted>``."""
        where = f"{path}:{self.line}" if self.line is not None else f"{path}"
        parts = [where]
        if self.column is not None:
            parts.append(f"column {self.column}")
        text = self.reason
        if self.value is not None:
            shown = self.value
            if len(shown) > _SHOWN_CHARS:
                shown = shown[: _SHOWN_CHARS - 3] + "..."
            text = f"value {shown!r} {text}"
        if self.accepted is not None:
            text = f"{text}; accepted: {self.accepted}"
        parts.append(text)
        return ": ".join(parts)


class TraceError(ValueError):
    """A trace file or directory that cannot be loaded as given.

    ``path`` is the file (or directory) at fault; ``problems`` are the first ``MAX_REPORTED``
    problems in line order; ``total`` counts all problems found (>= ``len(problems)``). The
    message has one ``problem.render(path)`` line per problem, then ``... and N more`` if any.
    """

    def __init__(
        self, path: Path, problems: Sequence[TraceProblem], total: int | None = None
    ) -> None:
        self.path = path
        self.problems = tuple(problems)
        self.total = len(self.problems) if total is None else total
        lines = [problem.render(path) for problem in self.problems]
        if self.total > len(self.problems):
            lines.append(f"... and {self.total - len(self.problems)} more problems in {path}")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.problems, self.total))


@dataclass(frozen=True, slots=True)
class _Found:
    """Problems of one check: how many rows failed it, and the first ``MAX_REPORTED``."""

    total: int
    first: list[TraceProblem]
    order: int  # tie-break between checks failing on the same line
