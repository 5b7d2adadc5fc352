"""``python -m triton_swa demo``: see :mod:`triton_swa.cli`."""

from .cli import main

raise SystemExit(main())
