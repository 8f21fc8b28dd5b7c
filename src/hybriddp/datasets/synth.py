"""Seeded synthetic search logs calibrated to the AOL and Yandex logs (ALGORITHM.md §10).

The real logs cannot be shipped (AOL: research-only licence; Yandex: 16 GB), so experiments and tests
run on synthetic logs whose statistics match the published ones (paper Figures 8 and 9). This module is
the public face of :mod:`hybriddp.datasets`:

* :mod:`.presets` -- the calibrated presets (:data:`PRESETS`, :class:`SynthPreset`, :class:`RankLaw`)
  and the population they fix (:func:`head_record_probabilities`);
* :mod:`.generator` -- :func:`generate`, the generative model;
* :mod:`.writers` -- :func:`write_log`, Parquet or the AOL TSV layout;
* :mod:`.synth_parts` -- a log of any size as a directory of Parquet parts.
"""

from hybriddp.datasets.generator import QUERY_PREFIX, URL_PREFIX, generate
from hybriddp.datasets.presets import PRESETS, RankLaw, SynthPreset, get_preset, head_record_probabilities
from hybriddp.datasets.writers import WRITE_FORMATS, synthetic_names, write_log

__all__ = [
    "PRESETS", "QUERY_PREFIX", "URL_PREFIX", "WRITE_FORMATS", "RankLaw", "SynthPreset", "generate", "get_preset",
    "head_record_probabilities", "synthetic_names", "write_log",
]
