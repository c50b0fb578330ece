"""gpushare kubelet device plugin: GPU inventory, the v1beta1 DevicePlugin service, Allocate."""
