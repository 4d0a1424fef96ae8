"""Write this worker's whole environment as JSON to $OUT_DIR/<$WHO>_<LOCAL_RANK>_<RANK>.json."""

import json
import os
from pathlib import Path

name = f"{os.environ['WHO']}_{os.environ['LOCAL_RANK']}_{os.environ['RANK']}.json"
Path(os.environ["OUT_DIR"], name).write_text(json.dumps(dict(os.environ)))
