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

from gpushare.core.model import ContainerRequest, PodRequest

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
    plain: ContainerRequest | None = field(init=False, repr=False, compare=False)
    """The ``ContainerRequest`` this ask is on every node (derived), ``None`` when it waits
    for a node: memory in MiB or percent, GPUs by type or UUID."""

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
        request = ContainerRequest(  # ValueError for what no request can have
            self.name, self.gpu_share, self.gpu_count, self.allowed_models, self.compute_milli,
            self.exclusive, self.allocate_resource, self.kubelet_units,
        )  # fmt: skip
        plain = not (
            self.memory_basis
            or self.gpu_types
            or self.excluded_gpu_types
            or self.gpu_uuids
            or self.excluded_gpu_uuids
        )
        object.__setattr__(self, "plain", request if plain else None)

    @property
    def names_gpus(self) -> bool:
        """Whether it chooses GPUs by type or UUID (or avoids some)."""
        return bool(
            self.gpu_types or self.excluded_gpu_types or self.gpu_uuids or self.excluded_gpu_uuids
        )

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
    plain: PodRequest | None = field(init=False, repr=False, compare=False)
    """The ``PodRequest`` this ask is on every node (derived; what ``resolve`` returns for it,
    the same object), ``None`` when a container waits for a node (``ContainerAsk.plain``)."""
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False)
    """A hashable key of everything a placement decision depends on, not the pod's name
    (derived; ``PodRequest.shape`` for a plain ask)."""
    two_dimensional: bool = field(init=False, repr=False, compare=False)
    """Whether a container asks compute or whole GPUs (derived)."""
    gpu_total: int = field(init=False, repr=False, compare=False)
    """GPU memory asked as written, ``gpu_share × gpu_count`` summed over containers (derived):
    in the node's unit for a plain ask (``PodRequest.gpu_total``), else each container's
    amount in its own ``memory_basis`` (for reports of a pod no node resolved)."""

    def __post_init__(self) -> None:
        # One pass: the codec builds an ask for every pod the API lists and every request.
        plain: list[ContainerRequest] | None = []
        gpu: list[ContainerAsk] = []
        two_dimensional = False
        total = 0
        for c in self.containers:
            if c.gpu_count:
                gpu.append(c)
                total += c.gpu_share * c.gpu_count
                two_dimensional = two_dimensional or bool(c.compute_milli) or c.exclusive
            if plain is not None:
                if c.plain is None:
                    plain = None
                else:
                    plain.append(c.plain)
        request = None
        if plain is not None:
            request = PodRequest(self.key, tuple(plain), self.cpu_milli, self.memory_mib)
        elif self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(
                f"pod {self.key}: cpu_milli and memory_mib must be >= 0, "
                f"got {self.cpu_milli} and {self.memory_mib}"
            )
        setattr_ = object.__setattr__
        setattr_(self, "gpu_containers", tuple(gpu))
        setattr_(self, "plain", request)
        setattr_(
            self,
            "shape",
            request.shape
            if request is not None
            else (self.cpu_milli, self.memory_mib, tuple(_shape(c) for c in self.containers)),
        )
        setattr_(self, "two_dimensional", two_dimensional)
        setattr_(self, "gpu_total", total)

    @classmethod
    def of(cls, request: PodRequest) -> PodAsk:
        """The ask that is ``request`` on every node (its ``plain`` is ``request``, the same
        object): for callers that hold a ``PodRequest`` already (the simulator, tests)."""
        ask = cls(
            request.key,
            tuple(
                ContainerAsk(
                    c.name, c.gpu_share, c.gpu_count, c.allowed_models, c.compute_milli,
                    c.exclusive, allocate_resource=c.allocate_resource,
                    kubelet_units=c.kubelet_units,
                )
                for c in request.containers
            ),
            request.cpu_milli,
            request.memory_mib,
        )  # fmt: skip
        object.__setattr__(ask, "plain", request)
        return ask


def _shape(c: ContainerAsk) -> tuple[object, ...]:
    """What a placement decision depends on in container ``c`` (not its name)."""
    return (
        c.gpu_share, c.gpu_count, c.allowed_models, c.compute_milli, c.exclusive, c.memory_basis,
        c.allocate_resource, c.kubelet_units, c.gpu_types, c.excluded_gpu_types, c.gpu_uuids,
        c.excluded_gpu_uuids,
    )  # fmt: skip
