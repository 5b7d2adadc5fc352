"""The README's benchmark tables are what scripts/readme_tables.py makes of the committed CSV rows:
no figure there is typed by hand."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_tables_come_from_the_committed_rows():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
