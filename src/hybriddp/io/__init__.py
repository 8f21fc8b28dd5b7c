"""Readers of input logs (AOL, CSV / TSV / Parquet tables, item logs)."""
