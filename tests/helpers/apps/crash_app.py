"""For the supervisor tests: a registry module whose import ends the process at once, as a
crash in a native extension would (no Python exception, no error message, exit status 3)."""

import os

os._exit(3)
