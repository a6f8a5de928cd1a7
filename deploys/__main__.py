"""``python -m gpuserve.deploys [NAME]``: the path of a packaged deploy file, or the names."""

import sys

from gpuserve.deploys import main

sys.exit(main())
