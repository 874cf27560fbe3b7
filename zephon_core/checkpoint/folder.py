"""The run's aggregation folder: ``<aggregate_dir>/<run_id>/`` on a filesystem or an object store.

Files are published atomically (rename on a filesystem, one PUT on an object
store), so a reader never sees half of one; listings are never cached.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import fsspec

from zephon_core.checkpoint.state import canonical_json
from zephon_core.errors import AggregationError
from zephon_core.sources.base import is_local

TMP_PREFIX = ".tmp-"


class AggregateFolder:
    """The run's folder, with atomic publication and uncached listing."""

    def __init__(self, aggregate_dir: str, run_id: str, storage_options: dict[str, Any]) -> None:
        fs, _, paths = fsspec.get_fs_token_paths(aggregate_dir, storage_options=storage_options)
        self.fs = fs
        self.local = is_local(fs)
        self.path = paths[0].rstrip("/") + "/" + run_id
        # Polling (seconds): first and longest sleep of the leader and of followers, and how often a
        # follower that joined a round re-reads round.json. A folder is cheap to poll; on an object
        # store every poll is a request, and followers (world_size - 1 of them) poll less often
        # (Aggregator stretches follow_poll_max_s with world_size there).
        if self.local:
            self.poll_s, self.lead_poll_max_s, self.follow_poll_max_s, self.round_recheck_s = 0.005, 0.05, 0.05, 0.0
        else:
            self.poll_s, self.lead_poll_max_s, self.follow_poll_max_s, self.round_recheck_s = 0.02, 0.1, 0.25, 1.0
        try:
            fs.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise AggregationError(f"cannot create aggregate folder {self.path}: {e}") from None

    def file(self, name: str) -> str:
        return f"{self.path}/{name}"

    def write(self, name: str, value: Any) -> None:
        data = canonical_json(value).encode()
        target = self.file(name)
        try:
            if self.local:
                fd, tmp = tempfile.mkstemp(dir=self.path, prefix=TMP_PREFIX)
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.chmod(tmp, 0o644)
                    os.replace(tmp, target)
                except BaseException:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    raise
            else:
                self.fs.pipe_file(target, data)
        except OSError as e:
            raise AggregationError(f"cannot write {target}: {e}") from None

    def read(self, name: str) -> Any | None:
        """The parsed file, or None when it does not exist (yet)."""
        target = self.file(name)
        try:
            data = self.fs.cat_file(target)
        except FileNotFoundError:
            return None
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise AggregationError(f"{target} is not valid JSON ({e}); was it written by something else?") from None

    def read_many(self, names: list[str]) -> dict[str, Any]:
        """Several files at once (concurrently on an object store); missing ones are left out."""
        if self.local or len(names) < 2:
            found = {n: self.read(n) for n in names}
            return {n: v for n, v in found.items() if v is not None}
        by_path = {self.file(n): n for n in names}
        raw = self.fs.cat(list(by_path), on_error="omit")
        out = {}
        for path, data in raw.items():
            name = by_path.get(path) or path.rstrip("/").rsplit("/", 1)[-1]
            try:
                out[name] = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise AggregationError(f"{self.file(name)} is not valid JSON ({e}); was it written by something else?") from None
        return out

    def names(self) -> list[str]:
        self.fs.invalidate_cache(self.path)
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.path, detail=False)]
        except FileNotFoundError:
            return []

    def remove(self, names: list[str]) -> None:
        if names and not self.local:
            try:  # one bulk request (S3 DeleteObjects) instead of one per file
                self.fs.rm([self.file(n) for n in names])
                return
            except (FileNotFoundError, OSError):
                pass
        for n in names:
            try:
                self.fs.rm_file(self.file(n))
            except (FileNotFoundError, OSError):
                pass
