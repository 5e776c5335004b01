"""`python -m genesys.cli`: the `genesys` command."""

import sys

from genesys.cli import main

sys.exit(main())
