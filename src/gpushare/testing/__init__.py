"""Test fakes and builders shared by the test tiers (test-only: needs the ``test`` extra).

* :mod:`gpushare.testing.controlplane`: a real etcd, kube-apiserver, kube-scheduler and kwok on
  loopback (built by ``scripts/build-controlplane.sh``).
* :mod:`gpushare.testing.nodes`: fake GPU-share nodes (kwok), including the
  ``gpushare.io/gpu-inventory`` annotation contract.
* :mod:`gpushare.testing.extender_stub`: a scripted scheduler extender that records every call.

The runtime packages (``gpushare.core`` and the others) never import this package.
"""
