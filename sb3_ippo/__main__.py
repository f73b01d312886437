import sys

from sb3_ippo.cli import main

sys.exit(main())
