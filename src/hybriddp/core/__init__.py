"""The shared core every party builds on: records and head lists, noise and randomness, parameters, errors,
counting, and atomic files. It imports no party (docs/ARCHITECTURE.md)."""
