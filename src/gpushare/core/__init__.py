"""The pure core: model, fit checks, ledger, fragmentation and placement policies.

No I/O and no imports outside the standard library and numpy (enforced by
``tests/test_layering.py``). Adapters (simulator, extender, device plugin, inspect) call these.
"""
