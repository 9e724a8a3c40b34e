"""One version: the Cargo workspace version is what the package metadata, ``__version__``,
the crates, the lock file and the changelog say.

Runs against the installed wheel (or the sdist's build) from outside the source tree: the
source files are read from the checkout or the unpacked sdist these tests live in.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import protoprompt

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def _toml(relpath: str) -> dict:
    return tomllib.loads((REPO / relpath).read_text(encoding="utf-8"))


def cargo_version() -> str:
    return _toml("Cargo.toml")["workspace"]["package"]["version"]


def test_the_cargo_workspace_version_is_the_only_version_source() -> None:
    for crate in ("rust/core/Cargo.toml", "rust/python/Cargo.toml"):
        assert _toml(crate)["package"]["version"] == {"workspace": True}, crate
    project = _toml("pyproject.toml")["project"]
    assert "version" not in project, "pyproject.toml must not repeat the version"
    assert "version" in project["dynamic"]
    init = (REPO / "python" / "protoprompt" / "__init__.py").read_text(encoding="utf-8")
    literal = re.search(r"""__version__(\s*:\s*str)?\s*=\s*["']\d+\.\d+""", init)
    assert literal is None, "__init__.py hard-codes a version"


def test_metadata_and_dunder_version_equal_the_cargo_version() -> None:
    version = cargo_version()
    dist = metadata.distribution("protoprompt")
    # The metadata read is the one of the package under test, not of another copy.
    assert (
        Path(str(dist.locate_file("protoprompt/__init__.py"))).resolve()
        == Path(protoprompt.__file__).resolve()
    )
    assert dist.version == version
    assert metadata.version("protoprompt") == version
    assert protoprompt.__version__ == version


def test_the_lock_file_records_the_crates_at_the_workspace_version() -> None:
    version = cargo_version()
    packages = {p["name"]: p["version"] for p in _toml("Cargo.lock")["package"]}
    assert packages["protoprompt-core"] == version
    assert packages["protoprompt-python"] == version


def test_the_changelog_has_a_dated_section_for_this_version() -> None:
    version = cargo_version()
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", changelog, re.M)
    released = [(name, date) for name, date in sections if name != "Unreleased"]
    assert released, "CHANGELOG.md has no released section"
    newest, date = released[0]
    assert newest == version, f"newest CHANGELOG section is {newest}, the version is {version}"
    assert date, f"the {version} section has no date"


# The package index holds another, earlier package of this name (pure Python, 0.1.0-0.20.0):
# `pip install protoprompt` takes the highest version, so this one must sort above all of them.
INDEX_RELEASES_OF_THE_OTHER_LINE = ("0.1.0", "0.3.0", "0.6.1", "0.16.1", "0.19.0", "0.20.0")


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.match(r"\d+(\.\d+)*", version)[0].split("."))


def test_the_version_sorts_above_every_release_of_the_other_line_on_the_index() -> None:
    version = _release(cargo_version())
    for other in INDEX_RELEASES_OF_THE_OTHER_LINE:
        assert version > _release(other), f"{cargo_version()} sorts below {other} on the index"


def test_the_readme_install_line_asks_for_this_line_and_links_the_migration_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    major = cargo_version().split(".")[0]
    assert f"pip install 'protoprompt[agents]>={major}'" in install
    assert "(docs/migrating-from-0.20.md)" in install
    assert (REPO / "docs" / "migrating-from-0.20.md").is_file()
