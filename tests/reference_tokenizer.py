"""The reference tokenizer (openai/tiktoken), loaded offline.

tiktoken downloads its vocabularies at run time, which this project's machines cannot do. The
tiktoken-rs crate that protoprompt is built with ships the very same files; this module copies
them into a private tiktoken cache (tiktoken verifies their SHA-256) so that
``tiktoken.get_encoding`` works offline.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import tiktoken

_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_ROOT = Path(__file__).resolve().parents[1]


def _asset_dirs() -> list[Path]:
    dirs: list[Path] = []
    try:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked"],
            cwd=_ROOT, capture_output=True, text=True, check=True, timeout=120,
        ).stdout
        for pkg in json.loads(out)["packages"]:
            if pkg["name"] == "tiktoken-rs":
                dirs.append(Path(pkg["manifest_path"]).parent / "assets")
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        pass
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    dirs += [Path(p) for p in sorted(glob.glob(str(cargo_home / "registry/src/*/tiktoken-rs-*/assets")))]
    return dirs


@functools.lru_cache(maxsize=None)
def _cache_dir() -> str:
    cache = tempfile.mkdtemp(prefix="protoprompt-tiktoken-")
    for name in ("o200k_base", "cl100k_base", "p50k_base", "r50k_base"):
        for d in _asset_dirs():
            src = d / f"{name}.tiktoken"
            if src.is_file():
                key = hashlib.sha1(_URL.format(name=name).encode()).hexdigest()
                shutil.copy(src, os.path.join(cache, key))
                break
    return cache


@functools.lru_cache(maxsize=None)
def reference_encoding(name: str) -> tiktoken.Encoding:
    """``tiktoken.get_encoding(name)`` without network access."""
    os.environ["TIKTOKEN_CACHE_DIR"] = _cache_dir()
    return tiktoken.get_encoding(name)
