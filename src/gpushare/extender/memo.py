"""The filter and prioritize memo: the last answer per pod shape over a ``NodeNames`` list."""

from __future__ import annotations

from gpushare.extender.wire import HostPriority

_MEMO_LIMIT = 64


class _Memo:
    """The last filter or prioritize of one pod shape: its candidate names, the state epoch it
    reflects, per-node verdicts or values, and the assembled answer (``None``: to rebuild)."""

    __slots__ = ("epoch", "members", "names", "outcomes", "priorities", "result", "values")

    def __init__(self, names: list[str], epoch: int) -> None:
        self.names = names
        self.members = set(names)
        self.epoch = epoch
        self.outcomes: dict[str, tuple[int, str]] = {}
        self.values: dict[str, float] = {}
        self.result: tuple[list[str], dict[str, str], dict[str, str]] | None = None
        self.priorities: list[HostPriority] | None = None
