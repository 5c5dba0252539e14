"""``python -m accel_launch.commands.config``."""

from accel_launch.commands.config import main

raise SystemExit(main())
