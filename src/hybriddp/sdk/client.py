"""Every client of the SDK in one module: the public names of :mod:`hybriddp.sdk` (``AdminClient``,
``OptinUploader``, ``OptinRelay``, ``DeviceClient``, ``RetryPolicy``, the errors), for code importing them from here."""

from hybriddp.sdk import *  # noqa: F403
from hybriddp.sdk import __all__  # noqa: F401
