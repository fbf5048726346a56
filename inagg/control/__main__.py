import sys

from inagg.control.cli import controller_main

sys.exit(controller_main())
