"""Hugging Face Hub ids (`org/name`, `org/name@revision`) as local model folders, through
`huggingface_hub.snapshot_download`: its cache (`HF_HOME`, `HF_HUB_CACHE`), `HF_ENDPOINT` (a
mirror), `HF_HUB_OFFLINE` (the cache only), `HF_TOKEN` (private and gated models) and a revision
(branch, tag or commit) to pin. `kiln import-hf org/name` and the `import-model` stage's
`source:` / `sft`'s `base:` take them wherever they take a folder.

The variables are read when a model is resolved, not when huggingface_hub was imported, so a
process that sets them late (a test, a notebook) is honoured too.
"""

from __future__ import annotations

import os
import re

from kiln.platform.errors import InputError

# what a model needs: config, safetensors weights (and their index), tokenizer files
MODEL_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_id(source: str) -> bool:
    """`org/name` or `org/name@revision` that names no local file or folder."""
    plain = not source.endswith((".gguf", ".safetensors", ".json", "/"))
    return plain and not os.path.exists(source) and bool(_HUB_ID.match(source))


def split_revision(source: str, revision: str | None = None) -> tuple[str, str | None]:
    """(`org/name`, revision): `--revision` wins over an `@revision` suffix."""
    repo_id, _, suffix = source.partition("@")
    return repo_id, revision or suffix or None


def _settings() -> dict:
    env = os.environ
    cache = env.get("HF_HUB_CACHE") or (
        os.path.join(env["HF_HOME"], "hub") if env.get("HF_HOME") else None
    )
    offline = (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").upper()
    return {
        "endpoint": env.get("HF_ENDPOINT") or None,
        "cache_dir": cache,
        "local_files_only": offline in _TRUE,
        "token": env.get("HF_TOKEN") or None,
    }


def resolve_hub_id(source: str, revision: str | None = None) -> str:
    """The local snapshot folder of Hub model `source` (downloading what the cache lacks)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, revision = split_revision(source, revision)
    settings = _settings()
    where = settings["endpoint"] or "the Hugging Face Hub"
    at = f" at revision {revision!r}" if revision else ""
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=MODEL_FILES, **settings)
    except GatedRepoError:
        raise InputError(
            f"{repo_id}: a gated model on {where}: accept its terms there and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"{source}: no such local folder, and no model {repo_id!r} on {where} (a private "
            "one needs HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise InputError(f"{repo_id}: no revision {revision!r} on {where}") from None
    except LocalEntryNotFoundError:
        why = (
            "HF_HUB_OFFLINE is set"
            if settings["local_files_only"]
            else f"{where} could not be reached (set HF_ENDPOINT for a mirror)"
        )
        raise InputError(f"{repo_id}{at}: not in the Hugging Face cache and {why}") from None
    except (HfHubHTTPError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{repo_id}{at}: download from {where} failed ({first})") from None


def local_model(source: str, revision: str | None = None) -> str:
    """`source` itself when it is a local path, else its Hub snapshot folder."""
    return resolve_hub_id(source, revision) if is_hub_id(source) else source
