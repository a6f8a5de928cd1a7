"""``python -m gpuserve.schema docs/configuration.md``: regenerate its key tables in place."""

import sys

from gpuserve.schema.doc import main

raise SystemExit(main(sys.argv[1:]))
