"""python3 -m megavm: the megavm command."""
import sys

from megavm.cli import main

sys.exit(main())
