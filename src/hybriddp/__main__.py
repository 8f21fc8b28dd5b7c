"""``python -m hybriddp`` = the ``hybriddp`` command."""

from hybriddp.cli import main

main()
