"""What a pod asks as it is written, before a node is chosen: ``PodAsk`` of ``ContainerAsk``.

A pod written in Alibaba's dialect (``aliyun.com/gpu-mem``) asks memory in the node's own unit
and GPUs by model at most: its ask is a ``PodRequest`` as it stands (``PodAsk.plain``). A pod
written for gpu-manager or HAMi may ask what only a node can turn into a ``PodRequest``:

* memory in MiB or in percent of each GPU (``ContainerAsk.memory_basis``: ``MIB_BASIS``,
  ``PERCENT_BASIS``), in the node's unit only once its unit and GPU sizes are known;
* GPUs by type (HAMi's ``nvidia.com/use-gputype``/``nouse-gputype``: substrings of the model,
  any case), which become the node's GPU models that match;
* GPUs by UUID (``nvidia.com/use-gpuuuid``/``nouse-gpuuuid``), which become positions of the
  node's GPUs.

The adapter (``gpushare.kube.codec.pod_request``) reads every pod into a ``PodAsk``;
``gpushare.core.resolve.resolve`` turns it into the ``PodRequest`` for one node, the only
request type the rest of the core computes with. Pure; frozen and hashable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpushare.core.model import ContainerRequest, PodRequest, check_container

__all__ = ["MIB_BASIS", "PERCENT_BASIS", "ContainerAsk", "PodAsk"]

MIB_BASIS = "MiB"
"""``ContainerAsk.memory_basis`` of memory asked in MiB."""
PERCENT_BASIS = "% of the GPU"
"""``ContainerAsk.memory_basis`` of memory asked in percent of each GPU's memory."""
_BASES = ("", MIB_BASIS, PERCENT_BASIS)


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """What one container asks as written: the fields of ``ContainerRequest`` (``gpu_share``
    in ``memory_basis``) and what is chosen per node.

    ``memory_basis``: ``""`` (the node's unit, the default), ``MIB_BASIS`` or
    ``PERCENT_BASIS``. ``gpu_types`` and ``excluded_gpu_types``: GPU types the container may
    use or must avoid, each a substring of the model, any case. ``gpu_uuids`` and
    ``excluded_gpu_uuids``: GPUs it may use or must avoid, by UUID. The other fields mean what
    they mean in ``ContainerRequest``. ``ValueError`` for a combination no request can have:
    an unknown basis, a basis without memory, and whatever ``ContainerRequest`` refuses.
    """

    name: str
    gpu_share: int
    gpu_count: int = 1
    allowed_models: frozenset[str] = frozenset()
    compute_milli: int = 0
    exclusive: bool = False
    memory_basis: str = ""
    allocate_resource: str = ""
    kubelet_units: int | None = None
    gpu_types: tuple[str, ...] = ()
    excluded_gpu_types: tuple[str, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    excluded_gpu_uuids: tuple[str, ...] = ()
    per_node: bool = field(init=False, repr=False, compare=False)
    """Whether it waits for a node (derived): memory in MiB or percent, GPUs by type or
    UUID."""

    def __post_init__(self) -> None:
        if self.memory_basis not in _BASES:
            raise ValueError(
                f"container {self.name}: memory_basis must be one of {_BASES}, "
                f"got {self.memory_basis!r}"
            )
        if self.memory_basis and not self.gpu_share:
            raise ValueError(
                f"container {self.name}: memory in {self.memory_basis} needs gpu_share > 0"
            )
        check_container(
            self.name, self.gpu_share, self.gpu_count, self.compute_milli, self.exclusive
        )
        per_node = bool(
            self.memory_basis
            or self.gpu_types
            or self.excluded_gpu_types
            or self.gpu_uuids
            or self.excluded_gpu_uuids
        )
        object.__setattr__(self, "per_node", per_node)

    @property
    def allocate_units(self) -> int:
        """Device IDs kubelet passes to Allocate for this container, as
        ``ContainerRequest.allocate_units``: ``kubelet_units``, else ``gpu_share × gpu_count``
        (an ask in the node's unit)."""
        return self.gpu_share * self.gpu_count if self.kubelet_units is None else self.kubelet_units

    def request(
        self,
        gpu_share: int,
        allowed_models: frozenset[str] | None = None,
        allowed_positions: frozenset[int] = frozenset(),
    ) -> ContainerRequest:
        """The ``ContainerRequest`` of this container with ``gpu_share`` units of the node's
        memory, ``allowed_models`` (default: the ask's own) and ``allowed_positions``.
        ``ValueError`` as ``ContainerRequest``."""
        return ContainerRequest(
            self.name,
            gpu_share,
            self.gpu_count,
            self.allowed_models if allowed_models is None else allowed_models,
            self.compute_milli,
            self.exclusive,
            allocate_resource=self.allocate_resource,
            kubelet_units=self.kubelet_units,
            allowed_positions=allowed_positions,
        )


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What a pod asks as written: its ``containers`` (``ContainerAsk``, GPU and CPU-only, in
    spec order) and its pod-level CPU and memory; ``key`` as in ``PodRequest``.
    ``ValueError`` as ``PodRequest``."""

    key: str
    containers: tuple[ContainerAsk, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_containers: tuple[ContainerAsk, ...] = field(init=False, repr=False, compare=False)
    """The containers that ask for GPU, in declaration order (derived)."""
    per_node: bool = field(init=False, repr=False, compare=False)
    """Whether a container waits for a node (derived; ``ContainerAsk.per_node``)."""
    two_dimensional: bool = field(init=False, repr=False, compare=False)
    """Whether a container asks compute or whole GPUs (derived)."""
    gpu_total: int = field(init=False, repr=False, compare=False)
    """GPU memory asked as written, ``gpu_share × gpu_count`` summed over containers (derived):
    in the node's unit for a plain ask (``PodRequest.gpu_total``), else each container's
    amount in its own ``memory_basis`` (for reports of a pod no node resolved)."""
    _built: list[PodRequest | None] = field(
        init=False, repr=False, compare=False, default_factory=list
    )
    """``plain`` once built (empty before): most asks read from the API (a watch, a report)
    are never placed, and need none."""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(
                f"pod {self.key}: cpu_milli and memory_mib must be >= 0, "
                f"got {self.cpu_milli} and {self.memory_mib}"
            )
        gpu: list[ContainerAsk] = []
        per_node = two_dimensional = False
        total = 0
        for c in self.containers:  # one pass: the codec builds an ask for every pod it reads
            per_node = per_node or c.per_node
            if c.gpu_count:
                gpu.append(c)
                total += c.gpu_share * c.gpu_count
                two_dimensional = two_dimensional or bool(c.compute_milli) or c.exclusive
        setattr_ = object.__setattr__
        setattr_(self, "gpu_containers", tuple(gpu))
        setattr_(self, "per_node", per_node)
        setattr_(self, "two_dimensional", two_dimensional)
        setattr_(self, "gpu_total", total)

    @property
    def plain(self) -> PodRequest | None:
        """The ``PodRequest`` this ask is on every node (what ``resolve`` returns for it on
        every node, the same object), ``None`` when a container waits for a node
        (``per_node``). Built on first use."""
        built = self._built
        if not built:
            built.append(
                None
                if self.per_node
                else PodRequest(
                    self.key,
                    tuple(c.request(c.gpu_share) for c in self.containers),
                    self.cpu_milli,
                    self.memory_mib,
                )
            )
        return built[0]

    @property
    def shape(self) -> tuple[object, ...]:
        """A hashable key of everything a placement decision depends on, not the pod's name:
        ``PodRequest.shape`` of a plain ask."""
        plain = self.plain
        if plain is not None:
            return plain.shape
        return (self.cpu_milli, self.memory_mib, tuple(_shape(c) for c in self.containers))


def _shape(c: ContainerAsk) -> tuple[object, ...]:
    """What a placement decision depends on in container ``c`` (not its name)."""
    return (
        c.gpu_share, c.gpu_count, c.allowed_models, c.compute_milli, c.exclusive, c.memory_basis,
        c.allocate_resource, c.kubelet_units, c.gpu_types, c.excluded_gpu_types, c.gpu_uuids,
        c.excluded_gpu_uuids,
    )  # fmt: skip
