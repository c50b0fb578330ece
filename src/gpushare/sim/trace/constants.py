"""File names and limits of the openb trace format, and how many problems an error lists."""

from __future__ import annotations

from typing import Final

NODE_FILE: Final = "openb_node_list_gpu_node.csv"
"""File name of the node list in a trace directory."""
POD_FILE_PREFIX: Final = "openb_pod_list_"
"""Pod lists are named ``<POD_FILE_PREFIX><workload>.csv``."""
GPU_CAPACITY_MILLI: Final = 1000
"""Capacity of one trace GPU, in milli-GPU."""
MAX_GPUS_PER_NODE: Final = 64
"""Largest accepted ``gpu`` count of a node."""
MAX_GPUS_PER_POD: Final = 64
"""Largest accepted ``num_gpu`` of a pod (the openb data has at most 8)."""
MAX_REPORTED: Final = 5
"""How many problems one ``TraceError`` message lists (its ``total`` counts them all)."""
EMBEDDED_WORKLOAD: Final = "default"
"""Workload name of the synthetic trace shipped in the package."""
