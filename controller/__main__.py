import sys

from inagg.controller.cli import controller_main

sys.exit(controller_main())
