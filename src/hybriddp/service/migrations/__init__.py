"""Alembic migrations of the service database, run programmatically (``upgrade head``) at startup.

A Python package (not data files) so that a plain ``pip install`` ships them; see
:func:`hybriddp.service.store.migrate`.
"""
