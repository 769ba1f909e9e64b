import sys

from knobfleet.cli import main

sys.exit(main())
