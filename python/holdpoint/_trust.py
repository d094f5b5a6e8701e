"""Which signatures a load accepts: holdpoint.TrustPolicy (docs/threat-model.md, "Signatures")."""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


class TrustPolicy:
    """The keys whose signatures a load accepts, as the C++ ``holdpoint::TrustPolicy``.

    - ``keys``: key files: Ed25519 public keys in PEM (``holdpoint keygen`` writes
      ``KEY.pub``; ``openssl pkey -pubout`` too) or holdpoint HMAC-SHA-256 key files.
    - ``revoked``: revocation lists, one 32-hex key id a line (``#`` comments).
    - ``required``: an unsigned file is refused (``signature_missing``) when true;
      read unsigned when false. A signature that is there is always checked.

    A load under a policy checks ``FILE.sig`` before a byte of ``FILE`` is read; the
    digest it vouches for becomes the one the file must have. Each refusal has its
    own code: ``signature_missing``, ``signature_malformed``,
    ``signature_key_unknown``, ``signature_key_revoked``, ``signature_invalid``,
    ``signature_statement_mismatch``; a key file that does not read is
    ``key_file_invalid``. Key files are read at each load, so a rotated key or an
    updated revocation list takes effect at once.
    """

    def __init__(self, keys: Iterable[PathLike], *, revoked: Iterable[PathLike] = (), required: bool = True) -> None:
        self.keys = [os.fspath(key) for key in keys]
        self.revoked = [os.fspath(path) for path in revoked]
        self.required = bool(required)
        if not self.keys:
            raise ValueError("TrustPolicy needs at least one key file")

    def _native(self) -> dict[str, Any]:
        return {"keys": self.keys, "revoked": self.revoked, "required": self.required}

    def __repr__(self) -> str:
        return f"TrustPolicy(keys={self.keys!r}, revoked={self.revoked!r}, required={self.required!r})"


def native_trust(trust: Optional[TrustPolicy]) -> Optional[dict[str, Any]]:
    if trust is None:
        return None
    if not isinstance(trust, TrustPolicy):
        raise TypeError(f"trust must be a holdpoint.TrustPolicy, not {type(trust).__name__}")
    return trust._native()
