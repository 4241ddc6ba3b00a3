"""`python -m preproj` is the `preproj` command (torchrun launches it this way)."""

import sys

from .cli import main

sys.exit(main())
