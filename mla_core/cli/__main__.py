"""``python -m mla_core.cli``: the same as the ``mla-core`` command."""
import sys

from . import main

sys.exit(main())
