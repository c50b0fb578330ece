"""gpushare on Dynamic Resource Allocation (``resource.k8s.io/v1``): the node's GPUs published as
devices with consumable memory and compute (``slices``), for kube-scheduler to allocate to
ResourceClaims. docs/dra.md says what runs today and what is still to come."""
