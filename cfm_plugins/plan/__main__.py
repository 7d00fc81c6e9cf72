"""``python -m cfm_plugins.plan``: the ``cfm-plan`` command."""

from cfm_plugins.plan.cli import main

raise SystemExit(main())
