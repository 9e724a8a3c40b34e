"""Smoke test of an installed protoprompt (a wheel or an sdist build) in its environment.

Checks what a user does first: the package imports from the environment (not a source tree),
reports the version of its own metadata, counts tokens, packs a history with a tool call
within a budget, names a bad item in its exception, and (``--example``) runs the offline
Agents SDK example; ``--readme`` runs the README's Quick start as a new user would, on the
package's public offline model (``protoprompt.testing``), and checks it prints what the
README shows; ``--demo`` runs ``protoprompt demo`` through the installed command and the
inspect command it prints. Exits non-zero on the first failure.

    python scripts/smoke_wheel.py [--version X.Y.Z] [--example examples/openai_agents_session.py]
        [--readme README.md] [--demo]

Run it from a directory outside the checkout, with the environment's interpreter.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def check_install(expected_version: str | None) -> None:
    import protoprompt
    from protoprompt import _core

    package = Path(protoprompt.__file__).resolve().parent
    if package.is_relative_to(REPO / "python"):
        raise SystemExit(f"protoprompt was imported from the source tree ({package})")
    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    platlib = Path(sysconfig.get_paths()["platlib"]).resolve()
    if package.parent not in (purelib, platlib):
        raise SystemExit(f"protoprompt was imported from {package}, not this environment")
    version = metadata.version("protoprompt")
    assert protoprompt.__version__ == version, (protoprompt.__version__, version)
    if expected_version is not None:
        assert version == expected_version, f"installed {version}, expected {expected_version}"
    print(
        f"protoprompt {version} from {package} (native module {Path(_core.__file__).name}), "
        f"Python {sys.version.split()[0]}"
    )


def check_counting() -> None:
    import protoprompt as pp

    # Fixed facts of the vocabularies (equal to tiktoken's counts).
    assert pp.count_tokens("hello world") == 2
    assert pp.count_tokens("Hello, world!", model="gpt-5") == 4
    assert pp.count_tokens("Hello, world!", encoding="cl100k_base") == 4
    text = "The agreement renews automatically unless notice is given ninety days before."
    assert pp.count_tokens_batch(["hello world", text]) == [2, pp.count_tokens(text)]
    assert pp.encoding_for_model("gpt-4.1") == "o200k_base"
    print(f"count_tokens: ok ({pp.count_tokens(text)} tokens in a {len(text)}-character sentence)")


def check_packing() -> None:
    import protoprompt as pp

    old = "Please summarise the whole contract for me. " * 40
    history = [
        {"role": "user", "content": old},
        {"role": "assistant", "content": "It is a one-year services agreement."},
        {"role": "user", "content": "When does it renew?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup_clause",
            "arguments": '{"name": "renewal"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": "Renews every 1 March unless notice is given 90 days before.",
        },
        {"role": "assistant", "content": "Every 1 March, unless notice is given 90 days before."},
        {"type": "function_call_output", "call_id": "call_gone", "output": "orphan"},
    ]
    new_input = [{"role": "user", "content": "And the latest date to give notice?"}]
    result = pp.pack(history, new_input, budget=200, output_reserve=50, model="gpt-5")
    assert result.used <= 200, result.used
    # The long first message does not fit, and the assistant's reply to it is not sent without
    # it (kept history starts at a user message); the newest turn fits, the orphan output never.
    assert result.kept_history == [2, 3, 4, 5], result.kept_history
    expected = [history[i] for i in result.kept_history] + new_input
    assert len(result.items) == len(expected)
    assert all(a is b for a, b in zip(result.items, expected, strict=True)), (
        "the caller's own objects, in order"
    )
    reasons = {p: d.decision for d in result.decisions for p in d.positions}
    assert reasons[0] == "over_budget" and reasons[1] == "turn_incomplete", reasons
    assert reasons[6] == "invalid_unit", reasons
    call_unit = next(d for d in result.decisions if 3 in d.positions)
    assert call_unit.positions == [3, 4], "a call and its output are one unit"
    assert "over_budget" in result.explain()

    try:
        pp.pack([{"role": "user", "content": float("nan")}], new_input, budget=100)
    except pp.InvalidItemError as exc:
        assert "history[0]" in str(exc), exc
    else:
        raise AssertionError("a NaN in an item must raise InvalidItemError")
    try:
        pp.pack(history, new_input, budget=5)
    except pp.TokenBudgetExceededError as exc:
        assert exc.budget == 5, exc
    else:
        raise AssertionError("a budget below the new input must raise TokenBudgetExceededError")
    print(
        f"pack: ok (kept {len(result.kept_history)} of {len(history)} history items, "
        f"{result.used}/{result.budget} tokens)"
    )


def run_example(path: Path) -> None:
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{path.name} failed with exit code {proc.returncode}")
    turns = [line for line in proc.stdout.splitlines() if line.startswith("turn ")]
    assert len(turns) == 6 and "PLAN" in proc.stdout, proc.stdout
    print(f"{path.name}: ok ({len(turns)} turns; last: {turns[-1]})")


QUICK_START_RUNNER = """\
import sys, warnings
from protoprompt import UnbudgetedSessionWarning
from protoprompt.testing import offline_models

warnings.simplefilter("error", UnbudgetedSessionWarning)
code = open(sys.argv[1], encoding="utf-8").read()
with offline_models():
    exec(compile(code, "README.md, Quick start", "exec"), {"__name__": "__main__"})
"""


def quick_start(readme: Path) -> tuple[str, list[str]]:
    """The Python blocks of the README's Quick start section, as one script, and the lines of
    the output block it shows (``<!-- doc: output -->``)."""
    text = readme.read_text(encoding="utf-8")
    parts = text.split("\n## Quick start", 1)
    if len(parts) != 2:
        raise SystemExit(f"{readme}: no '## Quick start' section")
    section = parts[1].split("\n## ", 1)[0]
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", section, re.DOTALL | re.MULTILINE))
    shown = re.search(
        r"<!-- doc: output -->\n```text\n(.*?)^```", section, re.DOTALL | re.MULTILINE
    )
    if not code or shown is None:
        raise SystemExit(f"{readme}: the Quick start has no python block or no output block")
    return code, shown[1].rstrip("\n").splitlines()


def run_readme_quick_start(readme: Path) -> None:
    code, expected = quick_start(readme)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "quick_start.py"
        script.write_text(code, encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, "-c", QUICK_START_RUNNER, str(script)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp,
        )
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"the README's Quick start failed with exit code {proc.returncode}")
    got = [line.rstrip() for line in proc.stdout.rstrip("\n").splitlines()]
    answers = [line for line in got if line.startswith("(offline gpt-5 model) You asked: ")]
    assert len(answers) == 2, proc.stdout
    assert got[-len(expected) :] == [line.rstrip() for line in expected], (
        "the Quick start's plan differs from the README's:\n" + proc.stdout
    )
    print(f"README Quick start: ok (2 answers, the plan the README shows: {expected[1]})")


def run_demo() -> None:
    command = Path(sys.executable).parent / "protoprompt"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [str(command), "demo", "my-demo"], capture_output=True, text=True, timeout=300, cwd=tmp
        )
        if proc.returncode != 0:
            sys.stdout.write(proc.stdout)
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"protoprompt demo failed with exit code {proc.returncode}")
        turns = re.findall(r"^=== turn \d", proc.stdout, re.MULTILINE)
        assert len(turns) == 6, proc.stdout
        inspect = shlex.split(proc.stdout.strip().splitlines()[-1])
        assert inspect[:2] == ["protoprompt", "inspect"], proc.stdout
        shown = subprocess.run(
            [str(command), *inspect[1:]], capture_output=True, text=True, timeout=300, cwd=tmp
        )
        assert shown.returncode == 0, shown.stderr
        assert (Path(tmp) / "my-demo" / "plan.html").is_file()
    print(f"protoprompt demo: ok ({len(turns)} turns; its inspect command ran)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", help="the version the installed package must report")
    parser.add_argument("--example", type=Path, help="the offline example to run (needs agents)")
    parser.add_argument(
        "--readme", type=Path, help="run this README's Quick start offline (needs agents)"
    )
    parser.add_argument("--demo", action="store_true", help="run `protoprompt demo` (needs agents)")
    args = parser.parse_args()
    check_install(args.version)
    check_counting()
    check_packing()
    if args.example is not None:
        run_example(args.example.resolve())
    if args.readme is not None:
        run_readme_quick_start(args.readme.resolve())
    if args.demo:
        run_demo()


if __name__ == "__main__":
    main()
