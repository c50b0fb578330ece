"""``make demo``: a local GPU-sharing cluster from the project's real components.

``python -m gpushare.demo up|status|down`` (``gpushare.demo.__main__``) runs the test control
plane with kube-controller-manager, kwok GPU nodes, ``gpushare extender`` and a second
kube-scheduler wired to it as the chart wires it (``gpushare.demo.cluster``), and applies the
examples of ``examples/`` (``gpushare.demo.examples``). Built on ``gpushare.testing``: not part of
the runtime packages.
"""
