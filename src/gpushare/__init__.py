"""gpushare: shared-GPU scheduling for Kubernetes (extender, device plugin, inspect, simulator)."""

__version__ = "0.1.0"
