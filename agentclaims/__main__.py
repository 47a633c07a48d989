"""``python -m agentclaims``: the ``agentclaims`` command, for an environment whose scripts
folder is not on ``PATH``."""

from agentclaims.cli.main import main

raise SystemExit(main())
