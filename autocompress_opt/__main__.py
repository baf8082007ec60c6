"""``python -m autocompress_opt`` is the ``autocompress`` command."""

import sys

from autocompress_opt.cli import main

sys.exit(main())
