"""`python -m orl ...` = the `orl` command (for checkouts used without installing the package)."""
import sys

from .cli import main

sys.exit(main())
