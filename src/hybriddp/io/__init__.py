"""Readers and writers of files: logs (:mod:`.loaders`, one module per format, and :mod:`.values`), device
reports (:mod:`.parquet_reports`) and the documents the parties exchange (:mod:`.exchange`)."""
