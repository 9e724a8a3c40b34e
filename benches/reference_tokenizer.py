"""The reference tokenizer: OpenAI's own ``tiktoken``, loaded offline.

``tiktoken`` normally downloads its vocabulary files. protoprompt's Rust core uses the copies
that ship inside the ``tiktoken-rs`` crate; this module feeds exactly those files to the real
Python ``tiktoken`` (its own regex, special tokens and SHA-256 check, via
``tiktoken_ext.openai_public``), so no network is needed and both sides count with the same
vocabulary.

The asset is located, in order:

1. ``$PROTOPROMPT_TIKTOKEN_ASSETS`` (a directory holding ``<name>.tiktoken``);
2. the ``tiktoken-rs`` package of this workspace (``cargo metadata`` -> manifest_path);
3. ``$CARGO_HOME/registry/src/*/tiktoken-rs-*/assets`` (newest version first).

The file is copied into a private tiktoken cache directory under the name tiktoken expects
(``sha1(url)``), then the encoding is built by tiktoken itself.
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

__all__ = ["ENCODINGS", "AssetNotFoundError", "find_asset", "get_encoding", "count"]

# name -> expected SHA-256 of the vocabulary file (as in tiktoken_ext.openai_public).
ENCODINGS = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_REPO = Path(__file__).resolve().parent.parent


class AssetNotFoundError(RuntimeError):
    """The tiktoken vocabulary file could not be found offline."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name.rsplit("-", 1)[-1]
    return tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def _candidates(name: str) -> list[Path]:
    out: list[Path] = []
    env = os.environ.get("PROTOPROMPT_TIKTOKEN_ASSETS")
    if env:
        out.append(Path(env) / f"{name}.tiktoken")
    try:
        meta = subprocess.run(
            ["cargo", "metadata", "--format-version", "1"],
            cwd=_REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        for pkg in json.loads(meta.stdout)["packages"]:
            if pkg["name"] == "tiktoken-rs":
                out.append(Path(pkg["manifest_path"]).parent / "assets" / f"{name}.tiktoken")
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        pass
    cargo_home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    pattern = os.path.join(cargo_home, "registry", "src", "*", "tiktoken-rs-*", "assets")
    for d in sorted(glob.glob(pattern), key=_version_key, reverse=True):
        out.append(Path(d) / f"{name}.tiktoken")
    return out


@functools.lru_cache(maxsize=None)
def find_asset(name: str) -> Path:
    """Path of a verified ``<name>.tiktoken`` vocabulary file."""
    if name not in ENCODINGS:
        raise ValueError(f"unsupported encoding {name!r}; expected one of {sorted(ENCODINGS)}")
    tried: list[str] = []
    for path in _candidates(name):
        if not path.is_file():
            tried.append(f"{path} (missing)")
            continue
        if _sha256(path) != ENCODINGS[name]:
            tried.append(f"{path} (SHA-256 mismatch)")
            continue
        return path
    raise AssetNotFoundError(
        f"cannot find the tiktoken vocabulary {name}.tiktoken offline. It ships with the "
        "tiktoken-rs crate: run `cargo fetch` in the repository (or build it once), or set "
        "PROTOPROMPT_TIKTOKEN_ASSETS to a directory containing it.\nTried:\n  "
        + "\n  ".join(tried or ["(no candidate locations)"])
    )


@functools.lru_cache(maxsize=None)
def get_encoding(name: str = "o200k_base"):
    """A real ``tiktoken.Encoding`` built from the offline vocabulary (cached per process).

    tiktoken reads the vocabulary through its download cache; the cache is a temporary
    directory that is removed as soon as the encoding is built (nothing is left in /tmp)."""
    import tiktoken
    import tiktoken_ext.openai_public as public

    asset = find_asset(name)
    url = _URL.format(name=name)
    saved = {k: os.environ.get(k) for k in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="protoprompt-tiktoken-") as cache:
        shutil.copyfile(asset, os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()))
        os.environ["TIKTOKEN_CACHE_DIR"] = cache
        try:
            spec = getattr(public, name)()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return tiktoken.Encoding(**spec)


def count(text: str, encoding: str = "o200k_base") -> int:
    """Reference token count: ``len(encode_ordinary(text))`` (special tokens as text)."""
    return len(get_encoding(encoding).encode_ordinary(text))


# Same name as the helper in tests/reference_tokenizer.py (when both directories are collected
# in one pytest run, whichever module is imported first serves both).
reference_encoding = get_encoding
