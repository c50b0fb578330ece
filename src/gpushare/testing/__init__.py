"""Test fakes and builders shared by the test tiers (test-only: needs the ``test`` extra).

* :mod:`gpushare.testing.core`: builders of core values (nodes, node states, pod requests) for
  table-driven unit tests.
* :mod:`gpushare.testing.controlplane`: a real etcd, kube-apiserver, kube-scheduler and kwok on
  loopback (built by ``scripts/build-controlplane.sh``).
* :mod:`gpushare.testing.nodes`: fake GPU-share nodes (kwok), including the
  ``gpushare.io/gpu-inventory`` annotation contract.
* :mod:`gpushare.testing.extender_stub`: a scripted scheduler extender that records every call.
* :mod:`gpushare.testing.kwokstart`: the device plugin's handshake record for kwok nodes (which
  run none), so that their pods do not stay *starting* (the demo runs it).
* :mod:`gpushare.testing.kubelet`: a stand-in for kubelet's device manager (Registration service,
  ListAndWatch consumer, Allocate as kubelet makes it, restarts).
* :mod:`gpushare.testing.nvml`: a declared fake of NVML (devices, XID events, failing probes).
* :mod:`gpushare.testing.dialects`: pods in gpu-manager's, HAMi's and Alibaba's cloud's request
  dialects, gpu-manager's two README pods among them.
* :mod:`gpushare.testing.daemon`: the device plugin daemon run in the test's event loop with the
  kubelet stand-in.
* :mod:`gpushare.testing.outcome` and :mod:`gpushare.testing.outcome2d`: a run judged from the
  pods' annotations alone (memory only; every dialect in memory and compute).
* :mod:`gpushare.testing.pods`: GPU pods created already bound, with the extender's annotations.
* :mod:`gpushare.testing.metrics`: a sample summed from a running program's ``/metrics``.
* :mod:`gpushare.testing.strategies`: Hypothesis strategies (any JSON value) for property tests.
* :mod:`gpushare.testing.helm`: the Helm binary (``scripts/build-helm.sh``) and the chart
  rendered to objects.
* :mod:`gpushare.testing.schedconfig`: kube-scheduler configurations decoded strictly by the
  configuration API of Kubernetes 1.23 and 1.24 (``scripts/build-schedconfig.sh``).

The runtime packages (``gpushare.core`` and the others) never import this package.
"""
