import sys

from .cli import controller_main

sys.exit(controller_main())
