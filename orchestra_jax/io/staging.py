"""A local folder mirrored into a workdir folder, for writers that need a local file.

tensorboardX writes event files with local file operations (its own `gs://`
writer needs google-cloud-storage and a project of its own, and re-uploads
its whole buffer on every flush, outside this project's path layer). A
`StagedFolder` for a `gs://` target gives the writer a local temporary folder
and `upload()` copies every file in it that changed since the last upload to
the target, whole (an object store cannot append; event files are small).
For a local target the folder is the target itself and `upload()` does nothing.
A resumed run's writer starts a new event file; earlier ones stay in the target.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

from etils import epath

from orchestra_jax.io import paths


class StagedFolder:
    """`local`: the folder to write in; `upload()` brings `target` up to date."""

    def __init__(self, target: str | os.PathLike):
        self.target: epath.Path = paths.as_path(target)
        self.remote = paths.is_remote(self.target)
        if self.remote:
            self.local = pathlib.Path(tempfile.mkdtemp(prefix="orchestra_jax_staging_"))
        else:
            self.local = pathlib.Path(self.target)
            self.local.mkdir(parents=True, exist_ok=True)
        self._uploaded: dict[str, tuple[int, int]] = {}

    def upload(self) -> list[str]:
        """Copies new or changed files (by size and mtime) to the target; returns
        their names relative to the folder."""
        if not self.remote:
            return []
        copied = []
        for file in sorted(p for p in self.local.rglob("*") if p.is_file()):
            name = file.relative_to(self.local).as_posix()
            stat = file.stat()
            signature = (stat.st_size, stat.st_mtime_ns)
            if self._uploaded.get(name) == signature:
                continue
            destination = self.target / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(file.read_bytes())
            self._uploaded[name] = signature
            copied.append(name)
        return copied

    def close(self) -> None:
        """Uploads what is left and removes the local staging folder."""
        if not self.remote:
            return
        self.upload()
        shutil.rmtree(self.local, ignore_errors=True)
