"""Placement policies by name. Importing this package registers every built-in policy."""

from gpushare.core.policies import baselines, fgd, fgd_cpu, fgd_spare, simple
from gpushare.core.policies.base import (
    Generational,
    Policy,
    PolicyContext,
    TieBreak,
    TieBreaking,
    generational,
    make_policy,
    policy_names,
    policy_summary,
    register,
    tie_break_of,
)

__all__ = [
    "Generational",
    "Policy",
    "PolicyContext",
    "TieBreak",
    "TieBreaking",
    "baselines",
    "fgd",
    "fgd_cpu",
    "fgd_spare",
    "generational",
    "make_policy",
    "policy_names",
    "policy_summary",
    "register",
    "simple",
    "tie_break_of",
]
