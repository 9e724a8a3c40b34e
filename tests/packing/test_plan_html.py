"""The picture of the budget: ``plan.to_html()``, ``plans_to_html`` and ``inspect --html``.

The page is checked as data (one self-contained document, only the tags and attributes it
means to write, everything from items and databases escaped, the bar's segments in
proportion) and in a real browser: headless Chromium loads it and a screenshot is checked
pixel by pixel for the bar's segments. scripts/test.sh installs Chromium (Debian's
``chromium``) when it is missing and sets ``PROTOPROMPT_REQUIRE_BROWSER=1``, so CI never
skips that test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import protoprompt as pp  # noqa: E402
import protoprompt.cli  # noqa: E402
from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.integrations import ModelCallPlan, ProtoPromptSession  # noqa: E402
from protoprompt.plan import SECTIONS  # noqa: E402
from protoprompt.plan_html import (  # noqa: E402
    BAR_WIDTH,
    FREE_COLOUR,
    SECTION_COLOURS,
    STATUS_COLOURS,
    PlanView,
    plans_to_html,
    render,
)

HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>" onmouseover="alert(3)'

TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "section", "div", "span",
    "i", "details", "summary", "table", "tr", "th", "td", "pre",
}  # fmt: skip
ATTRIBUTES = {
    "lang",
    "charset",
    "http-equiv",
    "content",
    "class",
    "style",
    "title",
    "data-section",
    "open",
}


class Page(HTMLParser):
    """The tags, attributes and segments of a page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []  # the cells of each table row
        self._cell: list[str] | None = None
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.segments: list[tuple[str, float, str]] = []  # section, width px, title
        self.units: list[tuple[str, str]] = []  # status, title
        self.titles: list[str] = []
        self.styles: list[str] = []  # style attributes and the <style> sheet
        self._in_style = False
        self.feed(text)

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self._in_style = tag == "style"
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []
        a = dict(attrs)
        self.attributes.update(a)
        if a.get("style"):
            self.styles.append(a["style"] or "")
        if a.get("title"):
            self.titles.append(a["title"] or "")
        if tag == "span" and a.get("class") == "seg":
            width = float((a["style"] or "").split("width:")[1].split("px")[0])
            self.segments.append((a["data-section"] or "", width, a.get("title") or ""))
        if tag == "span" and (a.get("class") or "").startswith("u "):
            self.units.append(((a["class"] or "").split()[1], a.get("title") or ""))


def check_page(text: str) -> Page:
    """Self-contained (no tag or attribute that loads anything, no style that does), and
    nothing but what the page means to write: whatever the content, only these tags and
    attributes."""
    page = Page(text)
    assert page.tags <= TAGS, page.tags - TAGS
    assert page.attributes <= ATTRIBUTES, page.attributes - ATTRIBUTES
    style = " ".join(page.styles).lower()
    assert page.styles and not any(n in style for n in ("url(", "@import", "http", "expression"))
    assert "default-src 'none'" in text  # and the browser is told to load nothing
    return page


def check_bar(page: Page, sections: Any, *, which: int = 0) -> None:
    """The ``which``-th plan's bar: one segment per non-empty section, in order, then what is
    left, each as wide as its share of the budget."""
    expected = [(s.name, s.tokens) for s in sections if s.tokens > 0]
    if sections.remaining:
        expected.append(("left", sections.remaining))
    segments = page.segments
    start = 0
    for _ in range(which):  # skip earlier plans' bars
        start += next(i for i, seg in enumerate(segments[start:]) if seg[0] == "left") + 1
    got = segments[start : start + len(expected)]
    assert [g[0] for g in got] == [e[0] for e in expected]
    for (name, tokens), (_, width, title) in zip(expected, got, strict=True):
        assert width == pytest.approx(BAR_WIDTH * tokens / sections.budget, abs=1e-3)
        assert f"{tokens:,} tokens" in title, (name, title)


@function_tool
def lookup(name: str) -> str:
    """Look up a clause."""
    return f"clause {name}: " + "the parties agree to many things. " * 25


def run_plans(tmp_path: Path, *, turns: int = 5) -> tuple[list[ModelCallPlan], Any]:
    """The calls of a few runs of a tool-using agent on a session, and the last turn plan."""
    steps: list[list[Any]] = []
    for t in range(turns):
        steps += [
            [function_call("lookup", {"name": f"c{t}"}, call_id=f"call_{t}")],
            [assistant_message(f"answer {t} " + "words " * 30, item_id=f"m{t}")],
        ]
    model = ScriptedModel(steps)
    agent = Agent(name="a", instructions="Use the tool.", model=model, tools=[lookup])
    session = ProtoPromptSession("s", str(tmp_path / "s.db"))
    calls: list[ModelCallPlan] = []
    config = session.run_config(
        agent=agent,
        model="gpt-5",
        max_tokens=1200,
        output_reserve=100,
        on_call=calls.append,
        tracing_disabled=True,
    )

    async def go() -> None:
        for t in range(turns):
            await Runner.run(agent, f"question {t} {HOSTILE}", session=session, run_config=config)

    asyncio.run(go())
    return calls, config.call_model_input_filter.builder.last_plan


# --------------------------------------------------------------------------- as data


def test_a_pack_page_has_its_bar_and_units() -> None:
    history = [{"role": "user", "content": f"turn {i} " + "word " * 40} for i in range(8)]
    new = [{"role": "user", "content": "next"}]
    r = pp.pack(history, new, 300, output_reserve=30, context_tokens=12)
    page = check_page(r.to_html())
    check_bar(page, r.sections)
    # every history unit and the run input, coloured by what happened to it
    assert len(page.units) == len(r.decisions) + 1
    statuses = [u[0] for u in page.units]
    assert statuses[-1] == "mandatory"
    for (status, title), d in zip(page.units, r.decisions):
        assert status == ("kept" if d.decision == "kept" else "dropped")
        assert r.reason(d) in title
    assert "the fill stopped here" in " ".join(t for _, t in page.units)


def test_the_page_renders_the_plain_view_a_plan_makes(tmp_path: Path) -> None:
    history = [{"role": "user", "content": f"turn {i} " + "word " * 40} for i in range(8)]
    r = pp.pack(history, [{"role": "user", "content": "next"}], 300)
    view = r.view()
    assert isinstance(view, PlanView) and view.title == "pack"
    assert [u.decision for u in view.units[:-1]] == [d.decision for d in r.decisions]
    assert render([view], title="protoprompt: pack") == r.to_html() == plans_to_html(r)
    assert r.view(title="mine").title == "mine"
    with MemoryStore(tmp_path / "m.db") as store:
        scope = MemoryScope("acme", user="alice")
        store.remember("Alice likes tea", scope=scope)
        builder = TokenBudgetedContextBuilder(store, max_tokens=500, scope=scope)
        plan = builder.build([], [{"role": "user", "content": "What does Alice like?"}])
    turn = plan.view()
    assert turn.title == "turn plan" and turn.sections == plan.sections
    assert [b.text for b in turn.blocks] == [b.text for b in plan.blocks]
    assert plan.to_html() == render([turn], title="protoprompt: turn plan")
    with pytest.raises(TypeError, match="expected a PackResult, a ContextPlan or a ModelCallPlan"):
        plans_to_html([object()])


def test_a_runs_calls_on_one_page_and_the_turn_plan(tmp_path: Path) -> None:
    calls, turn = run_plans(tmp_path)
    page = check_page(plans_to_html(calls))
    assert page.tags >= {"section", "h2"}
    for k, plan in enumerate(calls):
        check_bar(page, plan.sections, which=k)
    text = plans_to_html(calls)
    assert text.count('<section class="plan">') == len(calls)
    assert text.count("model call 1:") == 5 and text.count("model call 2:") == 5
    # The hostile run input is escaped everywhere (the units' titles carry no content here,
    # the plan's own lines do).
    turn_page = check_page(turn.to_html())
    check_bar(turn_page, turn.sections)
    single = check_page(calls[-1].to_html())
    check_bar(single, calls[-1].sections)
    assert any("newest step" in t for t in single.titles)


def test_a_turn_page_shows_its_recalled_blocks_escaped(tmp_path: Path) -> None:
    scope = MemoryScope("acme", user="alice")
    with MemoryStore(tmp_path / "m.db") as store:
        store.remember(f"Alice likes {HOSTILE}", scope=scope)
        builder = TokenBudgetedContextBuilder(store, max_tokens=500, scope=scope)
        plan = builder.build([], [{"role": "user", "content": "What does Alice like?"}])
    text = plan.to_html()
    page = check_page(text)
    check_bar(page, plan.sections)
    assert "Alice likes &lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "context message" in text


def test_every_section_has_a_colour() -> None:
    assert tuple(SECTION_COLOURS) == SECTIONS
    colours = [*SECTION_COLOURS.values(), FREE_COLOUR]
    assert len(set(colours)) == len(colours)
    assert len(set(STATUS_COLOURS.values())) == len(STATUS_COLOURS)


# --------------------------------------------------------------------------- inspect


async def hostile_session(db: Path) -> None:
    """An SDK session whose stored items (and session id) try to inject markup."""
    steps = [
        [function_call("lookup", {"name": HOSTILE}, call_id="call_1")],
        [assistant_message(HOSTILE + " " + "words " * 200, item_id="m1")],
        [assistant_message("short", item_id="m2")],
    ]
    agent = Agent(name="a", model=ScriptedModel(steps), tools=[lookup])
    session = SQLiteSession(HOSTILE, db)
    try:
        await Runner.run(agent, HOSTILE, session=session)
        await Runner.run(agent, "and now?", session=session)
    finally:
        session.close()


def test_inspect_html_escapes_what_the_database_holds(tmp_path: Path) -> None:
    db = tmp_path / "agents.db"
    asyncio.run(hostile_session(db))
    out = tmp_path / "plan.html"
    code = pp.cli.main(
        [
            "inspect", str(db), "--session", HOSTILE, "--budget", "400", "--html", str(out),
            "--instructions", "Be brief.", "--json",
        ]
    )  # fmt: skip
    assert code == 0
    text = out.read_text()
    page = check_page(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "onmouseover=&quot;" in text  # the quote is escaped, never an attribute
    units = page.units
    assert any(status == "dropped" for status, _ in units)
    assert any("(row" in title for _, title in units)
    assert "next turn windowed" in text


def test_inspect_html_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "agents.db"
    asyncio.run(hostile_session(db))
    code = pp.cli.main(
        ["inspect", str(db), "--session", HOSTILE, "--html", str(tmp_path / "no" / "x.html")]
    )
    assert code == 1
    assert "cannot write" in capsys.readouterr().err


# --------------------------------------------------------------------------- in a browser


def browser() -> str | None:
    found = os.environ.get("PROTOPROMPT_BROWSER") or shutil.which("chromium")
    if found:
        return found
    if os.environ.get("PROTOPROMPT_REQUIRE_BROWSER") == "1":
        pytest.fail("no chromium: scripts/test.sh installs Debian's chromium for this test")
    pytest.skip("needs chromium (apt-get install chromium), or PROTOPROMPT_BROWSER")
    return None


def screenshot(html_file: Path, png: Path, exe: str) -> None:
    subprocess.run(
        [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--window-size=1100,700",
            f"--screenshot={png}", html_file.as_uri(),
        ],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_chromium_draws_the_budget_bar(tmp_path: Path) -> None:
    """The first plan's bar in a screenshot: from its left edge, one run of pixels per
    non-empty section in its colour, as long as its share of the budget (to a pixel), then
    the tokens left."""
    PIL = pytest.importorskip("PIL.Image")
    exe = browser()
    assert exe is not None
    calls, _ = run_plans(tmp_path, turns=3)
    plan = calls[-1]  # a tool step: newest step, kept history, instructions, tools
    page = tmp_path / "plan.html"
    page.write_text(plan.to_html())
    png = tmp_path / "plan.png"
    screenshot(page, png, exe)
    image = PIL.open(png).convert("RGB")
    first = rgb(SECTION_COLOURS["instructions"])
    # The bar starts at the page's left padding (24 px); find its first row.
    x0 = 24
    y = next(y for y in range(image.height) if image.getpixel((x0 + 1, y)) == first)
    y += 18  # the bar's middle (36 px high)
    row = [image.getpixel((x, y)) for x in range(x0, x0 + BAR_WIDTH)]
    runs: list[list[Any]] = []
    for px in row:
        if runs and runs[-1][0] == px:
            runs[-1][1] += 1
        else:
            runs.append([px, 1])
    # Anti-aliased boundary pixels (a blend of two colours) belong to neither run.
    colours = {rgb(c): n for n, c in SECTION_COLOURS.items()} | {rgb(FREE_COLOUR): "left"}
    named = [(colours[px], n) for px, n in runs if px in colours]
    sections = plan.sections
    expected = [(s.name, s.tokens) for s in sections if s.tokens > 0]
    expected.append(("left", sections.remaining))
    assert [n for n, _ in named] == [n for n, _ in expected]
    for (name, width), (_, tokens) in zip(named, expected, strict=True):
        assert abs(width - BAR_WIDTH * tokens / sections.budget) <= 2, (name, width, tokens)
    # The units strip below: a kept unit's colour and a mandatory one's are drawn.
    drawn = {image.getpixel((x, yy)) for x in range(x0, x0 + 300) for yy in range(y, y + 200)}
    assert rgb(STATUS_COLOURS["kept"]) in drawn and rgb(STATUS_COLOURS["mandatory"]) in drawn


def test_chromium_draws_masked_and_dropped_units_in_their_own_colours(tmp_path: Path) -> None:
    """A page with masked and dropped units in a screenshot: both statuses' colours are in
    the strip, and the dropped colour is nowhere in the bar (no section has it)."""
    PIL = pytest.importorskip("PIL.Image")
    exe = browser()
    assert exe is not None
    r = _masked_and_dropped()
    page = tmp_path / "plan.html"
    page.write_text(r.to_html())
    png = tmp_path / "plan.png"
    screenshot(page, png, exe)
    image = PIL.open(png).convert("RGB")
    x0 = 24
    free = rgb(FREE_COLOUR)
    bar_y = next(y for y in range(image.height) if image.getpixel((x0 + BAR_WIDTH - 2, y)) == free)
    bar = {image.getpixel((x, bar_y + 18)) for x in range(x0, x0 + BAR_WIDTH)}
    strip = {
        image.getpixel((x, y))
        for x in range(x0, x0 + BAR_WIDTH)
        for y in range(bar_y + 40, min(bar_y + 200, image.height))
    }
    for status in ("dropped", "masked", "kept", "mandatory"):
        assert rgb(STATUS_COLOURS[status]) in strip, status
    assert rgb(STATUS_COLOURS["dropped"]) not in bar


def test_a_long_history_shows_its_newest_units_and_counts_the_rest() -> None:
    from protoprompt.plan_html import MAX_UNITS

    history = [{"role": "user", "content": f"turn {i}"} for i in range(MAX_UNITS + 50)]
    r = pp.pack(history, [{"role": "user", "content": "next"}], 200)
    page = check_page(r.to_html())
    assert len(page.units) == MAX_UNITS + 1  # and the run input
    assert "50 older units: 50 over_budget" in page.titles


# --------------------------------------------------------------------------- what it says


def _masked_and_dropped() -> Any:
    history: list[Any] = []
    for i in range(6):
        history += [
            {"role": "user", "content": f"check batch {i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "line item " * 200},
            {"role": "assistant", "content": f"batch {i} ok"},
        ]
    r = pp.pack(history, [{"role": "user", "content": "next"}], 1_200, masking=pp.Masking())
    assert r.masked and r.dropped
    return r


def test_the_table_runs_in_the_strips_order_and_says_a_dropped_unit_was_not_sent() -> None:
    r = _masked_and_dropped()
    page = check_page(r.to_html())
    header, *rows = page.rows
    assert header[:2] == ["where", "section"]
    # One order: the table's rows are the strip's boxes, oldest first.
    assert [row[0] for row in rows] == [t.split(" ")[0] for _, t in page.units]
    assert rows[0][0] == "history[0]"
    by_decision = {row[5]: row for row in rows}
    assert by_decision["over_budget"][1] == "dropped (not sent)"
    assert by_decision["masked"][1] == "kept history"
    assert "kept history" not in {row[1] for row in rows if row[5] == "over_budget"}


def test_the_page_totals_kept_masked_saved_and_dropped() -> None:
    r = _masked_and_dropped()
    text = r.to_html()
    totals = r.totals
    masked_units = sum(1 for d in r.decisions if d.decision == "masked")
    dropped = [d for d in r.decisions if not d.kept]
    assert f"{masked_units:,} masked ({r.masking_saved:,} tokens saved)" in text
    assert f"{len(dropped):,} dropped or invalid (" in text
    assert totals.masking_saved == r.masking_saved
    assert "1 unit mandatory" in text  # one item, one unit: never "1 items" or "1 units"
    assert "1 items" not in text and "1 units" not in text


def test_dropped_has_a_colour_of_its_own() -> None:
    dropped = rgb(STATUS_COLOURS["dropped"])
    others = [rgb(c) for c in (*SECTION_COLOURS.values(), FREE_COLOUR)]
    others += [rgb(c) for s, c in STATUS_COLOURS.items() if s != "dropped"]
    # Apart from every other colour of the page by more than a shade in some channel.
    for other in others:
        assert max(abs(a - b) for a, b in zip(dropped, other)) > 60, other


def test_inspect_html_gives_dropped_units_their_tokens(tmp_path: Path) -> None:
    db = tmp_path / "agents.db"
    asyncio.run(hostile_session(db))
    out = tmp_path / "plan.html"
    args = ["inspect", str(db), "--session", HOSTILE, "--budget", "400", "--no-masking"]
    assert pp.cli.main([*args, "--html", str(out)]) == 0
    rows = check_page(out.read_text()).rows[1:]
    dropped = [row for row in rows if row[1] == "dropped (not sent)"]
    assert dropped and all(row[3] != "-" and int(row[3].replace(",", "")) > 0 for row in dropped)
    assert all(row[4] == "-" for row in dropped)  # nothing of them was sent
