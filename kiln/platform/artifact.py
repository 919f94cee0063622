"""Artifacts: directories with an `artifact.json` describing what they hold.

`artifact.json` is written last, so a directory without one is an unfinished output
(a crash mid-stage leaves no half-artifact that a later run would trust).
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any

import fsspec

from kiln.platform.errors import InputError

MANIFEST = "artifact.json"


def _fs(uri: str):
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def parquet_files(directory: str) -> list[str]:
    """The Parquet shards directly inside an artifact directory, sorted (not `rejected/`, not
    the manifest)."""
    fs, root = _fs(directory)
    files = sorted(p for p in fs.ls(root, detail=False) if p.endswith(".parquet"))
    return files if "://" not in directory else [fs.unstrip_protocol(p) for p in files]


@dataclass
class Artifact:
    """A directory (local path or fsspec URI) plus its manifest."""

    uri: str
    kind: str
    fingerprint: str = ""
    stage: str = ""
    created: str = ""
    counts: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        """The artifact's location as stages open it: the same string as `uri` (a local path or
        an fsspec URI such as `s3://...`; nothing is downloaded or converted)."""
        return self.uri

    def join(self, *parts: str) -> str:
        return "/".join([self.uri.rstrip("/"), *parts])

    def exists(self) -> bool:
        fs, p = _fs(self.join(MANIFEST))
        return fs.exists(p)

    def commit(self) -> None:
        """Write the manifest: from now on the artifact counts as complete."""
        fs, root = _fs(self.uri)
        fs.makedirs(root, exist_ok=True)
        self.created = self.created or _dt.datetime.now(_dt.UTC).isoformat()
        body = {
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "stage": self.stage,
            "created": self.created,
            "counts": self.counts,
            "meta": self.meta,
        }
        tmp = self.join(MANIFEST + ".tmp")
        with fsspec.open(tmp, "w") as f:
            json.dump(body, f, indent=2, default=str)
        fs.mv(_fs(tmp)[1], _fs(self.join(MANIFEST))[1])

    @classmethod
    def load(cls, uri: str) -> Artifact:
        manifest = uri.rstrip("/") + "/" + MANIFEST
        try:
            with fsspec.open(manifest, "r") as f:
                body = json.load(f)
        except FileNotFoundError:
            raise InputError(
                f"{uri}: not an artifact (no {MANIFEST}); was its stage finished?"
            ) from None
        except json.JSONDecodeError as e:
            raise InputError(f"{manifest}: not valid JSON ({e.msg})") from None
        return cls(
            uri=uri,
            kind=body.get("kind", ""),
            fingerprint=body.get("fingerprint", ""),
            stage=body.get("stage", ""),
            created=body.get("created", ""),
            counts=body.get("counts", {}),
            meta=body.get("meta", {}),
        )
