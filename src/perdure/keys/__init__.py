"""Keys: what a node believes and what it keeps secret, all of it outside the store.

``folder`` (a node's key folder: its key, the roots it trusts, its certificate),
``identity`` (a node's identity and trust as an ``App`` holds them), ``anchors`` (the heads
a node has seen), ``verifier`` (checking memory against the trusted roots), ``data_keys``
(where the keys that wrap data keys come from), ``sealer`` (sealing and opening values
under per-object data keys), ``at_rest`` (sealing what an App writes), ``opener``
(readers opening what they may) and ``client`` (a caller's side of objects: the store,
this node's identity and data keys, signing events and checking memory). The pure rules
they apply live in ``core`` (``core.trust``, ``core.chain``, ``core.sealing``).
"""

from __future__ import annotations

from perdure.core.chain import Signer
from perdure.core.trust import Certificate, KeyRing, Revocation
from perdure.keys.anchors import HeadAnchors
from perdure.keys.client import Client
from perdure.keys.data_keys import DataKeys
from perdure.keys.folder import KeyFolder
from perdure.keys.identity import NodeIdentity
from perdure.keys.verifier import Verifier

__all__ = [
    "Certificate",
    "Client",
    "DataKeys",
    "HeadAnchors",
    "KeyFolder",
    "KeyRing",
    "NodeIdentity",
    "Revocation",
    "Signer",
    "Verifier",
]
