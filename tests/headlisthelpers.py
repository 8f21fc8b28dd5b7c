"""Head-list documents for the tests, built by hand: the pinned wire-format known answer (read by the
Python and the JavaScript device tests alike), and documents with any field changed or left out, hashed
here with hashlib from the canonical JSON, not with the code under test."""

from __future__ import annotations

import hashlib
import json

KAT_CANONICAL = ('{"delta":1e-05,"epsilon":4.0,"f_c":0.85,"format":"hybriddp-headlist","m_c":1,'
                 '"queries":[{"query":"café","urls":["http://a.example/été","http://b.example/"]},'
                 '{"query":"zürich","urls":[]}],"url_level":true,"version":1}')
"""The canonical JSON text, written by hand: keys sorted, separators "," and ":", non-ASCII as is."""
KAT_HASH = "sha256:c5505cf24735c2c0b95d8b484f938c254a229b2bc0cb9555fa9e6a9d5ca4774d"


def kat_doc() -> dict:
    """The same document with its keys in a non-sorted order (as a writer might hold it)."""
    return {"version": 1, "format": "hybriddp-headlist", "url_level": True, "m_c": 1, "f_c": 0.85,
            "epsilon": 4.0, "delta": 1e-5,
            "queries": [{"urls": ["http://a.example/été", "http://b.example/"], "query": "café"},
                        {"urls": [], "query": "zürich"}]}


DROP = object()
"""A field value that makes :func:`headlist_doc` leave the field out."""


def canonical_hash(doc: dict) -> str:
    """sha256 of the canonical JSON (keys sorted, no spaces, UTF-8) without the content_hash field."""
    body = {k: v for k, v in doc.items() if k != "content_hash"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                 ensure_ascii=False).encode("utf-8")).hexdigest()


def headlist_doc(**fields: object) -> dict:
    """Queries a (URLs u, v) and b (none), ε = 4, δ = 1e-5, f_C = 0.85, m_C = 1, with ``fields`` changed
    (:data:`DROP` leaves one out) and an unchecked content hash: for checks that fail before the hash."""
    doc = {"format": "hybriddp-headlist", "version": 1, "epsilon": 4.0, "delta": 1e-5, "f_c": 0.85, "m_c": 1,
           "url_level": True, "queries": [{"query": "a", "urls": ["u", "v"]}, {"query": "b", "urls": []}]}
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not DROP}
    doc["content_hash"] = "sha256:unchecked"
    return doc


def signed_headlist(**fields: object) -> dict:
    """:func:`headlist_doc` with its true content hash."""
    doc = headlist_doc(**fields)
    doc["content_hash"] = canonical_hash(doc)
    return doc
