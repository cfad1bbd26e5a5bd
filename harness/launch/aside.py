"""Earlier results moved aside, never deleted: a run folder that a new run replaces goes to
<out>/<suite>/.earlier/<date>/<run id>/, with the suite.toml it ran under.

One dated folder per `dtbench run` that moves anything; every one is kept (dtbench deletes no result: remove a dated
folder yourself once you no longer need it). The page and `dtbench claims` read only the suite folder's direct
subfolders, so what is set aside is never mixed into the results; `dtbench report <out>/<suite>/.earlier/<date>`
still reads it as a suite of its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

EARLIER = ".earlier"
SUITE_FILE = "suite.toml"


class Aside:
    """Moves run folders of one suite folder aside, into one dated folder made on the first move."""

    def __init__(self, suite_dir: Path):
        """Made before the new run replaces suite_dir/suite.toml: the file the moved runs ran under is read now."""
        self.suite_dir = suite_dir
        self.folder: Path | None = None
        self.moved: list[str] = []
        try:
            self._suite_file: bytes | None = (suite_dir / SUITE_FILE).read_bytes()
        except OSError:
            self._suite_file = None

    def move(self, run_dir: Path) -> Path:
        """Move run_dir (a folder of this suite) aside; -> where it went."""
        target = self._dated() / run_dir.name
        os.replace(run_dir, target)  # a rename within the suite folder: atomic, nothing copied
        self.moved.append(run_dir.name)
        return target

    def _dated(self) -> Path:
        if self.folder is None:
            root = self.suite_dir / EARLIER
            stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
            folder, n = root / stamp, 1
            while folder.exists():
                n += 1
                folder = root / f"{stamp}.{n}"
            folder.mkdir(parents=True)
            if self._suite_file is not None:  # what the moved runs ran under (the new run replaces it)
                (folder / SUITE_FILE).write_bytes(self._suite_file)
            self.folder = folder
        return self.folder

    def note(self) -> str | None:
        """One line saying what was moved where; None when nothing was."""
        if not self.moved:
            return None
        return f"{self.suite_dir}: {len(self.moved)} earlier run folder(s) moved aside to {self.folder} (kept, never " \
               "deleted)"
