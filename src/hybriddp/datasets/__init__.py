"""Synthetic search logs calibrated to AOL and Yandex (ALGORITHM.md §10); the public names are in :mod:`.synth`."""
