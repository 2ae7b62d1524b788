"""`python -m mlxcel_trio` is `mlxcel-server`."""

import sys

from .entry import server_main

sys.exit(server_main())
