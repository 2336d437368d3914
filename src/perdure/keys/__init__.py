"""Keys: what a node believes and what it keeps secret, all of it outside the store.

``folder`` (a node's key folder: its key, the roots it trusts, its certificate),
``identity`` (a node's identity and trust as an ``App`` holds them), ``anchors`` (the heads
a node has seen), ``verifier`` (checking memory against the trusted roots), ``data_keys``
(where the keys that wrap data keys come from), ``sealer`` (sealing and opening values
under per-object data keys), ``at_rest`` (the App's side of secrets at rest) and
``opener`` (readers opening what they may). The pure rules they apply live in ``core``
(``core.trust``, ``core.chain``, ``core.sealing``).
"""

__all__: list[str] = []
