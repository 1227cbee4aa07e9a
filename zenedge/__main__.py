import sys

from zenedge.cli import main

sys.exit(main())
