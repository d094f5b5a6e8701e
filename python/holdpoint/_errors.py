"""holdpoint.Error: every refusal of the core, with the same codes as the C++ library."""

from __future__ import annotations


class Error(Exception):
    """A checkpoint was refused, or an operation failed.

    ``code`` is the name of the C++ ``holdpoint::ErrorCode`` ("sha256_mismatch",
    "pickle_global_forbidden", ...): one code per kind of failure, listed by
    :func:`holdpoint.error_codes` and in docs/format.md. ``path`` is the file the
    error is about, when there is one; ``detail`` is the message without it.
    """

    def __init__(self, message: str, code: str, path: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.path = path
        self.detail = detail if detail is not None else message

    def __reduce__(self):  # picklable across processes (multiprocessing, pytest-xdist)
        return (type(self), (str(self), self.code, self.path, self.detail))
