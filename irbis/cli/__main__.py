"""``python -m irbis.cli``: the ``irbis`` command."""

import sys

from irbis.cli import main

sys.exit(main())
