"""Placement policies by name. Importing this package registers every built-in policy."""

from gpushare.core.policies import baselines, fgd, fgd_cpu, simple
from gpushare.core.policies.base import (
    Policy,
    PolicyContext,
    make_policy,
    policy_names,
    policy_summary,
    register,
)

__all__ = [
    "Policy",
    "PolicyContext",
    "baselines",
    "fgd",
    "fgd_cpu",
    "make_policy",
    "policy_names",
    "policy_summary",
    "register",
    "simple",
]
