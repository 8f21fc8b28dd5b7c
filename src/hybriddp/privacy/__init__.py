"""Privacy accounting: each mechanism's guarantee stated once (:mod:`.guarantees`), the one lifetime-budget rule
(:mod:`.budget`) and the one user pseudonym (:mod:`.pseudonyms`) that every ledger applies, and the users'
file ledger (:mod:`.ledger`) (PRIVACY.md)."""
