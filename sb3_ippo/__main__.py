import sys

from sb3_ippo.cli import main

# The guard matters: worker processes of vec_env_cls="subproc" import the main module again (as __mp_main__).
if __name__ == "__main__":
    sys.exit(main())
