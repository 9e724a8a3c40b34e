"""The SDK-version probes (``integrations._sdk._probes``) match every supported SDK line: the
installed one at run time (CI runs this in the venv of each line it tests), and the source
trees of the other lines when they are at hand (``PROTOPROMPT_SDK_SOURCES``: directories
holding ``agents/``, separated by ``os.pathsep``; this machine's unpacked releases by
default). A release that renames what a probe reads fails here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("agents")

from protoprompt.integrations._sdk import _probes  # noqa: E402

SUPPORTED = ("0.22.3", "0.23.1", "0.24.0")
_DEFAULT_SOURCES = os.pathsep.join(f"/work/sdk/openai_agents-{v}/src" for v in SUPPORTED)


def _sources() -> list[Path]:
    raw = os.environ.get("PROTOPROMPT_SDK_SOURCES", _DEFAULT_SOURCES)
    return [Path(p) for p in raw.split(os.pathsep) if p]


def test_every_probe_matches_the_installed_sdk() -> None:
    import agents

    assert _probes.runtime_mismatches() == [], agents.__version__
    assert _probes.PREPARE_CODE is not None


@pytest.mark.parametrize("src", _sources(), ids=lambda p: p.parent.name)
def test_every_probe_matches_each_supported_sdk_source(src: Path) -> None:
    if not (src / "agents").is_dir():
        pytest.skip(f"no SDK source tree at {src}")
    assert _probes.source_mismatches(src) == []


def test_a_probe_that_no_longer_matches_is_reported(tmp_path: Path) -> None:
    """The checks fail when the SDK renames what a probe reads or calls."""
    renamed = _probes.CodeProbe(
        _probes.PREPARE.module,
        _probes.PREPARE.qualname,
        reads=("session", "renamed_local"),
        calls=("renamed_call",),
    )
    (found,) = _probes.runtime_mismatches((renamed,))
    assert found.endswith(": no renamed_local, renamed_call")
    gone = _probes.CodeProbe(_probes.PREPARE.module, "prepare_input_renamed")
    assert "not found" in _probes.runtime_mismatches((gone,))[0]
    module = tmp_path / "agents" / "run_internal"
    module.mkdir(parents=True)
    (module / "session_persistence.py").write_text(
        "async def prepare_input_with_session(input, session, include_history_in_prepared_input):\n"
        "    history = await _session_get_items(session)\n"
        "    return history\n",
        encoding="utf-8",
    )
    (found,) = _probes.source_mismatches(tmp_path, (_probes.PREPARE,))
    assert found.endswith(": no session_input_callback, session_input_callback")


def test_the_validated_pop_probe_follows_the_installed_sdk() -> None:
    """0.24 pops through ``_pop_item_with_validation``; 0.22 has no such path."""
    import agents

    major_minor = tuple(int(x) for x in agents.__version__.split(".")[:2])
    assert _probes.SQLITE_VALIDATED_POP is (major_minor >= (0, 24))
    if _probes.SQLITE_VALIDATED_POP:
        assert _probes.runtime_mismatches((_probes.VALIDATED_POP,)) == []
