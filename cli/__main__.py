"""``python -m cli``: the ``testbed`` command."""

import sys

from cli.main import main

if __name__ == "__main__":
    sys.exit(main())
