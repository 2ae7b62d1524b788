"""`python -m mlxcel_trio` is `mlxcel-server`."""

import sys

from .cli.main import server_main

sys.exit(server_main())
