import sys

from knobfleet._entry import main

sys.exit(main())
