"""How a ledger names a user without naming them: a keyed hash with the ledger's secret salt (PRIVACY.md, "The
collection service stores nothing that links a report to a person").

Both ledgers that record users (the file ledger, :mod:`hybriddp.privacy.ledger`, and the collection service's
store) call :func:`pseudonym`; whoever lacks the salt cannot tell which user a pseudonym is, nor test a guess.
"""

from __future__ import annotations

import hashlib
import hmac

PSEUDONYM_CHARS = 32
"""Hex characters of a pseudonym: 128 bits of the HMAC."""


def keyed_digest(salt: bytes, text: str) -> str:
    """HMAC-SHA256(salt, text), hex (64 characters). ``text`` is hashed as UTF-8, a lone surrogate as the three
    bytes of its code point (``surrogatepass``), so every Python string has a digest."""
    return hmac.new(salt, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def pseudonym(salt: bytes, user: str) -> str:
    """A user's pseudonym in a ledger with this salt: HMAC-SHA256(salt, user), hex, truncated to 128 bits."""
    return keyed_digest(salt, user)[:PSEUDONYM_CHARS]


__all__ = ["PSEUDONYM_CHARS", "keyed_digest", "pseudonym"]
