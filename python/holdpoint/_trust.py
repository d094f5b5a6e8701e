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

    An outside witness closes what no signature inside a run directory can: a
    rollback of the whole directory, signatures included. Record the run's head
    elsewhere (a scheduler's log, a model registry) and give it back here:

    - ``min_head_step``: the run's newest signed generation is this step or later;
    - ``expected_head``: it is exactly this step (an ``int``) or the generation with
      this SHA-256 (64 hex digits).

    A run whose head falls short is refused with ``signature_rollback`` when it is
    opened, loaded, resumed or verified under the policy (docs/threat-model.md,
    "Outside witness").
    """

    def __init__(self, keys: Iterable[PathLike], *, revoked: Iterable[PathLike] = (), required: bool = True,
                 min_head_step: Optional[int] = None, expected_head: Union[int, str, None] = None) -> None:
        self.keys = [os.fspath(key) for key in keys]
        self.revoked = [os.fspath(path) for path in revoked]
        self.required = bool(required)
        if not self.keys:
            raise ValueError("TrustPolicy needs at least one key file")
        if min_head_step is not None and (isinstance(min_head_step, bool) or not isinstance(min_head_step, int)
                                          or min_head_step < 0):
            raise ValueError(f"min_head_step must be a non-negative int, not {min_head_step!r}")
        self.min_head_step = min_head_step
        if isinstance(expected_head, bool) or not (
                expected_head is None or (isinstance(expected_head, int) and expected_head >= 0)
                or (isinstance(expected_head, str) and len(expected_head) == 64
                    and all(c in "0123456789abcdef" for c in expected_head))):
            raise ValueError("expected_head must be a step (a non-negative int) or a SHA-256 (64 lowercase hex "
                             f"digits), not {expected_head!r}")
        self.expected_head = expected_head

    def _native(self) -> dict[str, Any]:
        return {"keys": self.keys, "revoked": self.revoked, "required": self.required,
                "min_head_step": self.min_head_step, "expected_head": self.expected_head}

    def __repr__(self) -> str:
        return (f"TrustPolicy(keys={self.keys!r}, revoked={self.revoked!r}, required={self.required!r}, "
                f"min_head_step={self.min_head_step!r}, expected_head={self.expected_head!r})")


def native_trust(trust: Optional[TrustPolicy]) -> Optional[dict[str, Any]]:
    if trust is None:
        return None
    if not isinstance(trust, TrustPolicy):
        raise TypeError(f"trust must be a holdpoint.TrustPolicy, not {type(trust).__name__}")
    return trust._native()
