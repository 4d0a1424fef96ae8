"""Create the file named by $MARKER (proof that a worker ran)."""

import os
from pathlib import Path

Path(os.environ["MARKER"]).touch()
