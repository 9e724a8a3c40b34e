"""Seeded generator of realistic OpenAI Agents SDK session histories.

The items are plain dicts in exactly the form ``SQLiteSession`` stores them: what the SDK's
``RunItem.to_input_item()`` produces (``model_dump(exclude_unset=True)`` of the Responses
output item minus ``created_by``) for model-emitted items, and the dicts the SDK builds
itself for tool outputs (``function_call_output``, status-less ``shell_call_output``,
``apply_patch_call_output``, ``mcp_approval_response``). User input is the SDK's easy-input
form ``{"content": ..., "role": "user"}``.

Every history is a fixed point of the SDK's sanitizer
(``agents.run_internal.items.drop_orphan_function_calls``) and contains no invalid unit for
protoprompt's item graph (see ``benches/test_history_gen.py``).

Mixes:

* ``chat``    -- user / reasoning / assistant messages, occasional hosted web search;
* ``tools``   -- function calling: multi-step turns, parallel calls, multi-KB JSON outputs,
  some apply_patch calls;
* ``agentic`` -- every item shape of ``docs/item-graph.md`` that a history may hold, in the
  forms the SDK stores them: function, custom, computer and local shell calls with their
  outputs; hosted shell calls with streamed (status-less) outputs; anonymous server tool
  search, also streamed (``in_progress`` chunks, then ``completed``), and client tool search
  with ``call_id``; hosted MCP approval chains (list, request, response, call); web, file
  search, code interpreter and image generation calls; apply_patch; programmatic tool calls
  (program, children with ``caller`` -- hosted ones too -- and program_output); long and
  id-less reasoning (``reasoning_item_id_policy="omit"``); compaction, additional_tools and
  configuration_update items; typed, developer and system messages; and turns of a Chat
  Completions model (the ``__fake_id__`` placeholder). ``benches/item_shapes.py`` lists the
  shapes; ``benches/test_history_gen.py`` checks that each one is generated.

Texts are English, Russian and code. ``generate(n, mix, seed)`` returns exactly ``n`` items;
the same arguments always give the same history.

Usage: ``python benches/history_gen.py 1000 agentic 7 > history.json``.
"""

from __future__ import annotations

import base64
import json
import random
import struct
import sys
import zlib
from typing import Any

__all__ = ["MIXES", "corpus_texts", "generate", "new_user_message", "next_turn", "png_data_url"]

MIXES = ("chat", "tools", "agentic")

Item = dict[str, Any]

# --------------------------------------------------------------------------------------------
# Vocabulary

_EN = """
the a an of to and in is it that for on with as was be this by are at from or have not but
which you they we his her can will one all would there their what so up out if about who get
when make like time just him know take people into year your good some could them see other
than then now look only come its over think also back after use two how our work first well
way even new want because any these give day most us agent session history token budget model
context request response tool call output reasoning message memory store retrieval contract
customer order invoice payment shipment warehouse report query database index cache latency
throughput deploy service cluster container kernel thread process buffer stream packet
schema field record table column row value parameter argument result error retry timeout
policy budget limit window summary document section clause renewal termination liability
analysis estimate forecast quarter revenue margin growth risk compliance audit review draft
please could you check whether the last change broke anything explain why does this happen
sure here is what I found based on the data above the numbers suggest that we should consider
""".split()

_RU = """
и в не на я быть он с что а по это она этот к но они мы как из у который то за свой что весь
год от так о для ты же все тот мочь вы человек такой его сказать только или ещё бы себя один
как уже до время если сам когда другой вот говорить наш мой знать стать при чтобы дело жизнь
кто первый очень два день её новый рука даже во со раз где там под можно ну какой после их
работа без самый потом надо хотеть ли слово идти большой должен место иметь ничто договор
клиент заказ счёт оплата доставка склад отчёт запрос база данных индекс кэш задержка сервис
кластер контейнер поток процесс буфер схема поле запись таблица столбец строка значение
параметр аргумент результат ошибка повтор таймаут политика бюджет лимит окно сводка документ
раздел пункт продление расторжение ответственность анализ оценка прогноз квартал выручка
пожалуйста проверьте последнее изменение объясните почему это происходит вот что я нашёл
""".split()

_EMOJI = ["🙂", "🚀", "✅", "⚠️", "🔥", "📈", "🤔", "👍", "🎉", "🧪"]

_IDENT = """
user order item total count index value result data config client session token budget
limit offset page cursor items rows batch chunk buffer reader writer handler request reply
payload header status code message error retries timeout deadline window cache store key
""".split()

_CODE_PY = [
    "def {f}({a}, {b}=None):",
    '    """{doc}"""',
    "    if {a} is None:",
    '        raise ValueError(f"{a} must be set, got {{{a}!r}}")',
    "    for {c} in {a}.{b}():",
    "        {d}[{c}.id] = {c}",
    "    return {{k: v for k, v in {d}.items() if v is not None}}",
    "    {d} = await client.{f}({a}={a}, {b}={n})",
    '    logger.info("{f}: %d {c}s", len({d}))',
    "class {F}({G}):",
    "    {a}: list[str] = field(default_factory=list)",
    "    async def {f}(self, {a}: int) -> dict[str, Any]:",
    '        return json.loads(self._{b}.read_text(encoding="utf-8"))',
    "import asyncio, json, os",
    "from dataclasses import dataclass, field",
    "    assert {a} == {n}, {a}",
]
_CODE_RS = [
    "pub fn {f}(&mut self, {a}: &[u8]) -> Result<usize, Error> {{",
    "    let {b} = self.{c}.get({a}).ok_or(Error::NotFound)?;",
    "    for ({d}, {c}) in {a}.iter().enumerate() {{",
    "        if {c}.len() > {n} {{ return Err(Error::TooLong({d})); }}",
    "    }}",
    "    Ok({b}.len())",
    "}}",
    "#[derive(Debug, Clone, PartialEq, Eq)]",
    "pub struct {F} {{ {a}: Vec<u32>, {b}: HashMap<String, usize> }}",
    "impl {F} {{",
    "    let mut {d} = Vec::with_capacity({n});",
]
_CODE_JS = [
    "export async function {f}({a}, {{ {b} = {n} }} = {{}}) {{",
    "  const {d} = await fetch(`/api/{c}/${{{a}}}`);",
    "  if (!{d}.ok) throw new Error(`{f} failed: ${{{d}.status}}`);",
    "  return {d}.json().then(({c}) => {c}.filter(x => x.{b} > {n}));",
    "}}",
    "const {F} = ({a}) => {a}.map(({c}, i) => ({{ ...{c}, i }}));",
]
_CODE_SQL = [
    "SELECT {a}, COUNT(*) AS {b}_count FROM {c}s",
    "WHERE {d}_id = ${n} AND created_at > now() - interval '7 days'",
    "GROUP BY {a} ORDER BY {b}_count DESC LIMIT {n};",
]
_CODE_SH = [
    "$ cargo test -p {c} -- --nocapture",
    '$ rg -n "{f}" src/ | head -{n}',
    "$ python -m pytest tests/test_{c}.py -q -k {f}",
    "$ git diff --stat HEAD~{n}",
]
_LANGS = [("python", _CODE_PY), ("rust", _CODE_RS), ("javascript", _CODE_JS), ("sql", _CODE_SQL)]

_TOOL_NAMES = [
    "search_docs",
    "get_customer",
    "list_orders",
    "query_database",
    "fetch_url",
    "read_file",
    "run_tests",
    "get_weather",
    "create_ticket",
    "lookup_invoice",
    "send_email",
    "get_metrics",
]
_MCP_SERVERS = [
    ("crm", ["delete_contact", "update_deal", "export_accounts"]),
    ("github", ["create_issue", "merge_pull_request", "close_issue"]),
]
_FILES = [
    "src/lib.rs",
    "src/pack.rs",
    "python/app/service.py",
    "web/src/index.ts",
    "README.md",
    "tests/test_api.py",
    "docs/guide.md",
]


def png_data_url(width: int, height: int, seed: int = 0) -> str:
    """A real PNG (random grey pixels) as a ``data:`` URL, as a screenshot is stored."""
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + rng.randbytes(width) for _ in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


class _Gen:
    """All randomness flows through one seeded ``random.Random``."""

    def __init__(self, seed: int, mix: str, tag: str = "") -> None:
        if mix not in MIXES:
            raise ValueError(f"unknown mix {mix!r}; expected one of {', '.join(MIXES)}")
        self.r = random.Random(f"protoprompt-bench:{mix}:{seed}:{tag}")
        self.mix = mix
        self.mcp_listed: set[str] = set()
        # reasoning_item_id_policy="omit" for the current turn: reasoning stored without id.
        self.omit_reasoning_ids = False

    # ---- ids -------------------------------------------------------------------------------
    def hex_id(self, prefix: str, nbytes: int = 24) -> str:
        return prefix + self.r.getrandbits(nbytes * 8).to_bytes(nbytes, "big").hex()

    def call_id(self) -> str:
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
        return "call_" + "".join(self.r.choices(alphabet, k=24))

    # ---- text ------------------------------------------------------------------------------
    def words(self, vocab: list[str], lo: int, hi: int) -> str:
        r = self.r
        out: list[str] = []
        n = r.randint(lo, hi)
        while len(out) < n:
            k = r.randint(5, 18)
            sent = r.choices(vocab, k=k)
            sent[0] = sent[0].capitalize()
            out.append(" ".join(sent) + r.choice([".", ".", ".", "?", "!", ":", ";"]))
        return " ".join(out)

    def prose(self, lo: int, hi: int, russian: float = 0.3) -> str:
        vocab = _RU if self.r.random() < russian else _EN
        return self.words(vocab, lo, hi)

    def code(self, lines_lo: int = 4, lines_hi: int = 30) -> tuple[str, str]:
        r = self.r
        lang, templates = r.choice(_LANGS)
        names = r.sample(_IDENT, 4)
        fmt = {
            "f": "_".join(r.sample(_IDENT, 2)),
            "F": "".join(w.capitalize() for w in r.sample(_IDENT, 2)),
            "G": r.choice(["Base", "Protocol", "Exception", "Generic"]),
            "a": names[0],
            "b": names[1],
            "c": names[2],
            "d": names[3],
            "n": r.randint(1, 4096),
            "doc": self.words(_EN, 1, 1)[:80],
        }
        lines = [r.choice(templates).format(**fmt) for _ in range(r.randint(lines_lo, lines_hi))]
        return lang, "\n".join(lines)

    def user_text(self) -> str:
        r = self.r
        x = r.random()
        if x < 0.25:
            lang, src = self.code(3, 15)
            return f"{self.prose(1, 3)}\n\n```{lang}\n{src}\n```\n\n{self.prose(1, 2)}"
        text = self.prose(1, 6)
        if r.random() < 0.1:
            text += " " + "".join(r.choices(_EMOJI, k=r.randint(1, 3)))
        return text

    def answer_text(self) -> str:
        r = self.r
        parts = [self.prose(2, 8)]
        if r.random() < 0.35:
            lang, src = self.code(5, 40)
            parts.append(f"```{lang}\n{src}\n```")
            parts.append(self.prose(1, 4))
        if r.random() < 0.3:
            parts.append("\n".join(f"- {self.prose(1, 1)}" for _ in range(r.randint(2, 6))))
        return "\n\n".join(parts)

    def json_blob(self, lo_bytes: int, hi_bytes: int) -> str:
        """A multi-KB JSON document (list of records), as a tool returns it."""
        r = self.r
        target = r.randint(lo_bytes, hi_bytes)
        records: list[dict[str, Any]] = []
        size = 0
        while size < target:
            rec = {
                "id": r.randint(1, 10**9),
                "name": " ".join(r.choices(_EN, k=3)).title(),
                "email": f"{r.choice(_IDENT)}.{r.choice(_IDENT)}@example.com",
                "status": r.choice(["active", "pending", "closed", "failed"]),
                "amount": round(r.uniform(0, 10000), 2),
                "tags": r.sample(_IDENT, r.randint(1, 4)),
                "created_at": f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
                f"T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z",
                "note": self.prose(0, 1, russian=0.2),
            }
            records.append(rec)
            size += len(json.dumps(rec, ensure_ascii=False))
        return json.dumps({"total": len(records), "items": records}, ensure_ascii=False)

    def encrypted(self) -> str:
        n = self.r.randint(600, 4500)
        return "gAAAAAB" + base64.urlsafe_b64encode(self.r.randbytes(n)).decode("ascii")

    # ---- items -----------------------------------------------------------------------------
    def user(self) -> Item:
        return {"content": self.user_text(), "role": "user"}

    def typed_message(self, role: str) -> Item:
        """An input message in its typed form (content parts), as a caller may pass one."""
        return {
            "type": "message",
            "role": role,
            "content": [{"type": "input_text", "text": self.user_text()}],
        }

    def instructions(self) -> Item:
        """A developer or system message the application adds to a turn's input."""
        text = "Follow the policy: " + self.prose(1, 3, russian=0.1)
        if self.r.random() < 0.5:
            return {"content": text, "role": self.r.choice(["developer", "system"])}
        return self.typed_message("developer")

    def reasoning(self) -> Item:
        r = self.r
        summary = []
        # Long reasoning (agentic mix): several paragraphs and a large encrypted payload.
        long = self.mix == "agentic" and r.random() < 0.12
        if long or r.random() < 0.6:
            summary = [
                {
                    "text": "**"
                    + self.words(_EN, 1, 1)[:60]
                    + "**\n\n"
                    + (self.prose(12, 30) if long else self.prose(1, 3)),
                    "type": "summary_text",
                }
                for _ in range(r.randint(2, 5) if long else r.randint(1, 2))
            ]
        encrypted = self.encrypted()
        if long:
            encrypted += base64.urlsafe_b64encode(r.randbytes(r.randint(4000, 16000))).decode()
        item: Item = {
            "id": self.hex_id("rs_"),
            "summary": summary,
            "type": "reasoning",
            "encrypted_content": encrypted,
        }
        if self.omit_reasoning_ids:
            del item["id"]  # stored so under reasoning_item_id_policy="omit"
        # One agentic reasoning item in ~25 is Claude's thinking through LitellmModel (picked
        # by its payload, so the random stream, and every other item, stays as it was).
        if self.mix == "agentic" and zlib.crc32(encrypted.encode()) % 25 == 0:
            return claude_thinking(item)
        return item

    def message(self, annotations: list[dict[str, Any]] | None = None) -> Item:
        return {
            "id": self.hex_id("msg_"),
            "content": [
                {
                    "annotations": annotations or [],
                    "text": self.answer_text(),
                    "type": "output_text",
                    "logprobs": [],
                }
            ],
            "role": "assistant",
            "status": "completed",
            "type": "message",
        }

    def function_call(self, caller: dict[str, Any] | None = None) -> Item:
        r = self.r
        args = {"query": self.prose(0, 1, russian=0.2)[:120], "limit": r.randint(1, 100)}
        if r.random() < 0.5:
            args["filters"] = {r.choice(_IDENT): r.choice(_IDENT) for _ in range(r.randint(1, 3))}
        item: Item = {
            "arguments": json.dumps(args, ensure_ascii=False),
            "call_id": self.call_id(),
            "name": r.choice(_TOOL_NAMES),
            "type": "function_call",
            "id": self.hex_id("fc_"),
            "status": "completed",
        }
        if caller is not None:
            item["caller"] = dict(caller)
        # One agentic call in ~30 is Gemini's, with its thought signature (picked by its call
        # id, so the random stream stays as it was).
        elif self.mix == "agentic" and zlib.crc32(item["call_id"].encode()) % 30 == 0:
            sig = base64.b64encode(item["call_id"].encode() * 6).decode()
            item["provider_data"] = {"thought_signature": sig, "model": "gemini/gemini-2.5-pro"}
        return item

    def function_output(self, call: Item) -> Item:
        out: Item = {
            "call_id": call["call_id"],
            "output": self.json_blob(1000, 8000),
            "type": "function_call_output",
        }
        if "caller" in call:
            out["caller"] = dict(call["caller"])
        return out

    def shell_call(self) -> Item:
        r = self.r
        fmt = {"c": r.choice(_IDENT), "f": r.choice(_IDENT), "n": r.randint(1, 50)}
        commands = [r.choice(_CODE_SH).format(**fmt)[2:] for _ in range(r.randint(1, 3))]
        action: dict[str, Any] = {"commands": commands, "timeout_ms": 120000}
        if r.random() < 0.5:
            action["max_output_length"] = 16384
        return {
            "action": action,
            "call_id": self.call_id(),
            "id": self.hex_id("sh_"),
            "status": "completed",
            "type": "shell_call",
        }

    def shell_outputs(self, call: Item) -> list[Item]:
        """1-3 streamed chunks, as the SDK stores them: no ``status``."""
        r = self.r
        outs: list[Item] = []
        for _ in range(r.randint(1, 3)):
            chunks = []
            for cmd in call["action"]["commands"]:
                lang, src = self.code(2, 25)
                stdout = src if r.random() < 0.6 else self.prose(1, 4, russian=0.1)
                chunks.append(
                    {
                        "stdout": stdout,
                        "stderr": ""
                        if r.random() < 0.8
                        else f"warning: {cmd} {self.prose(0, 1, russian=0)[:100]}",
                        "outcome": {"type": "exit", "exit_code": r.choice([0, 0, 0, 1])},
                    }
                )
            out: Item = {"type": "shell_call_output", "call_id": call["call_id"], "output": chunks}
            if "max_output_length" in call["action"]:
                out["max_output_length"] = call["action"]["max_output_length"]
            outs.append(out)
        return outs

    def apply_patch(self) -> tuple[Item, Item]:
        r = self.r
        path = r.choice(_FILES)
        lang, src = self.code(3, 20)
        diff = "\n".join(("+" if r.random() < 0.6 else "-") + line for line in src.splitlines())
        op_type = r.choice(["update_file", "update_file", "create_file"])
        call = {
            "call_id": self.call_id(),
            "id": self.hex_id("apc_"),
            "operation": {"diff": "@@\n" + diff, "path": path, "type": op_type},
            "status": "completed",
            "type": "apply_patch_call",
        }
        out = {
            "type": "apply_patch_call_output",
            "call_id": call["call_id"],
            "status": "completed",
            "output": f"Updated {path}",
        }
        return call, out

    def web_search(self) -> tuple[Item, list[dict[str, Any]]]:
        r = self.r
        urls = [
            f"https://{r.choice(_IDENT)}.example.org/{r.choice(_IDENT)}/{r.randint(1, 999)}"
            for _ in range(r.randint(1, 5))
        ]
        call = {
            "id": self.hex_id("ws_"),
            "action": {
                "query": self.prose(0, 1, russian=0.2)[:100],
                "type": "search",
                "sources": [{"type": "url", "url": u} for u in urls],
            },
            "status": "completed",
            "type": "web_search_call",
        }
        annotations = [
            {
                "end_index": 40 + 10 * i,
                "start_index": 10 * i,
                "title": "Source",
                "type": "url_citation",
                "url": u,
            }
            for i, u in enumerate(urls[:3])
        ]
        return call, annotations

    def tool_search(self) -> tuple[Item, Item]:
        """Anonymous server tool search: no ``call_id`` on either item."""
        r = self.r
        call = {
            "id": self.hex_id("tsc_"),
            "arguments": {"query": r.choice(_TOOL_NAMES)},
            "execution": "server",
            "status": "completed",
            "type": "tool_search_call",
        }
        tools = []
        for name in r.sample(_TOOL_NAMES, r.randint(1, 4)):
            props = {
                p: {
                    "type": r.choice(["string", "integer", "boolean"]),
                    "description": self.prose(0, 1, russian=0)[:120],
                }
                for p in r.sample(_IDENT, r.randint(1, 5))
            }
            tools.append(
                {
                    "name": name,
                    "parameters": {
                        "type": "object",
                        "properties": props,
                        "required": sorted(props),
                        "additionalProperties": False,
                    },
                    "strict": True,
                    "type": "function",
                    "description": self.prose(1, 2, russian=0),
                }
            )
        out = {
            "id": self.hex_id("tso_"),
            "execution": "server",
            "status": "completed",
            "tools": tools,
            "type": "tool_search_output",
        }
        return call, out

    def tool_search_streamed(self) -> list[Item]:
        """Anonymous server tool search whose output streamed: the SDK stores each chunk."""
        call, last = self.tool_search()
        chunks = []
        for _ in range(self.r.randint(1, 3)):
            chunk = dict(last, id=self.hex_id("tso_"), status="in_progress")
            chunk["tools"] = last["tools"][: self.r.randint(0, len(last["tools"]))]
            chunks.append(chunk)
        return [call, *chunks, last]

    def client_tool_search(self) -> tuple[Item, Item]:
        """Client-executed tool search: the application answers it, with the call's call_id."""
        call, out = self.tool_search()
        call_id = self.call_id()
        call = dict(call, call_id=call_id, execution="client")
        out = dict(out, call_id=call_id, execution="client")
        return call, out

    def custom_call(self) -> tuple[Item, Item]:
        r = self.r
        lang, src = self.code(2, 12)
        call = {
            "call_id": self.call_id(),
            "input": src,
            "name": r.choice(["grep", "sql", "patch_tool", "regex"]),
            "type": "custom_tool_call",
            "id": self.hex_id("ctc_"),
        }
        out = {
            "type": "custom_tool_call_output",
            "call_id": call["call_id"],
            "output": self.prose(1, 6, russian=0.1),
        }
        return call, out

    def computer_call(self) -> tuple[Item, Item]:
        r = self.r
        action = r.choice(
            [
                {"type": "screenshot"},
                {
                    "type": "click",
                    "button": "left",
                    "x": r.randint(0, 1279),
                    "y": r.randint(0, 799),
                },
                {"type": "type", "text": self.prose(0, 1, russian=0)[:60]},
                {"type": "scroll", "x": 400, "y": 300, "scroll_x": 0, "scroll_y": r.randint(1, 9)},
            ]
        )
        call = {
            "id": self.hex_id("cu_"),
            "action": action,
            "call_id": self.call_id(),
            "pending_safety_checks": [],
            "status": "completed",
            "type": "computer_call",
        }
        out = {
            "call_id": call["call_id"],
            "output": {
                "type": "computer_screenshot",
                "image_url": png_data_url(r.randint(16, 96), r.randint(16, 64), r.getrandbits(32)),
            },
            "type": "computer_call_output",
            "acknowledged_safety_checks": None,
        }
        return call, out

    def local_shell(self) -> tuple[Item, Item]:
        r = self.r
        fmt = {"c": r.choice(_IDENT), "f": r.choice(_IDENT), "n": r.randint(1, 50)}
        command = r.choice(_CODE_SH).format(**fmt)[2:].split()
        call = {
            "id": self.hex_id("lsh_"),
            "action": {"command": command, "env": {}, "type": "exec"},
            "call_id": self.call_id(),
            "status": "completed",
            "type": "local_shell_call",
        }
        out = {
            "type": "local_shell_call_output",
            "call_id": call["call_id"],
            "output": json.dumps({"stdout": self.code(2, 15)[1], "stderr": "", "exit_code": 0}),
        }
        return call, out

    def hosted_call(self, kind: str) -> Item:
        r = self.r
        if kind == "file_search_call":
            return {
                "id": self.hex_id("fs_"),
                "queries": [self.prose(0, 1, russian=0.2)[:80]],
                "status": "completed",
                "type": "file_search_call",
                "results": [
                    {
                        "file_id": self.hex_id("file_", 12),
                        "filename": r.choice(_FILES),
                        "score": round(r.random(), 3),
                        "text": self.prose(1, 4),
                    }
                    for _ in range(r.randint(1, 3))
                ],
            }
        if kind == "code_interpreter_call":
            return {
                "id": self.hex_id("ci_"),
                "code": self.code(3, 15)[1],
                "container_id": self.hex_id("cntr_", 12),
                "outputs": [{"type": "logs", "logs": self.prose(1, 3, russian=0)}],
                "status": "completed",
                "type": "code_interpreter_call",
            }
        return {
            "id": self.hex_id("ig_"),
            "result": png_data_url(32, 32, r.getrandbits(32)).split(",", 1)[1],
            "status": "completed",
            "type": "image_generation_call",
        }

    def compaction(self) -> Item:
        return {
            "id": self.hex_id("cmp_"),
            "encrypted_content": self.encrypted(),
            "type": "compaction",
        }

    def additional_tools(self) -> Item:
        return {
            "type": "additional_tools",
            "role": "developer",
            "tools": [
                {
                    "type": "function",
                    "name": self.r.choice(_TOOL_NAMES),
                    "parameters": {"type": "object", "properties": {}},
                    "strict": False,
                }
            ],
        }

    def configuration_update(self) -> Item:
        return {
            "type": "configuration_update",
            "reasoning": {"effort": self.r.choice(["low", "medium", "high"])},
        }

    # ---- turns -----------------------------------------------------------------------------
    def maybe_reasoning(self, p: float = 0.8) -> list[Item]:
        return [self.reasoning()] if self.r.random() < p else []

    def final(self, annotations: list[dict[str, Any]] | None = None) -> list[Item]:
        return self.maybe_reasoning(0.7) + [self.message(annotations)]

    def chat_turn(self) -> list[Item]:
        r = self.r
        items = [self.user()]
        if r.random() < 0.12:
            ws, ann = self.web_search()
            return items + self.maybe_reasoning(0.8) + [ws, self.message(ann)]
        items += self.final()
        if r.random() < 0.1:  # a follow-up message in the same response
            items.append(self.message())
        return items

    def function_step(self, max_parallel: int = 3) -> list[Item]:
        r = self.r
        n = 1 if r.random() < 0.65 else r.randint(2, max_parallel)
        calls = [self.function_call() for _ in range(n)]
        return self.maybe_reasoning() + calls + [self.function_output(c) for c in calls]

    def tools_turn(self) -> list[Item]:
        r = self.r
        items = [self.user()]
        for _ in range(r.randint(0, 4)):
            if r.random() < 0.15:
                call, out = self.apply_patch()
                items += self.maybe_reasoning() + [call, out]
            else:
                items += self.function_step()
        return items + self.final()

    def mcp_step(self) -> list[Item]:
        r = self.r
        server, names = r.choice(_MCP_SERVERS)
        items: list[Item] = []
        if server not in self.mcp_listed:
            self.mcp_listed.add(server)
            items.append(
                {
                    "id": self.hex_id("mcpl_"),
                    "server_label": server,
                    "tools": [
                        {
                            "input_schema": {"type": "object", "properties": {}},
                            "name": n,
                            "description": self.prose(1, 1, russian=0),
                        }
                        for n in names
                    ],
                    "type": "mcp_list_tools",
                }
            )
        name = r.choice(names)
        args = json.dumps(
            {"id": r.randint(1, 10**6), "reason": self.prose(0, 1)[:80]}, ensure_ascii=False
        )
        req = {
            "id": self.hex_id("mcpr_"),
            "arguments": args,
            "name": name,
            "server_label": server,
            "type": "mcp_approval_request",
        }
        items += self.maybe_reasoning() + [req]
        approve = r.random() < 0.85
        resp: Item = {
            "approval_request_id": req["id"],
            "approve": approve,
            "type": "mcp_approval_response",
        }
        if not approve:
            resp["reason"] = "Rejected by the operator"
        items.append(resp)
        call = {
            "id": self.hex_id("mcp_"),
            "arguments": args,
            "name": name,
            "server_label": server,
            "type": "mcp_call",
            "approval_request_id": req["id"],
            "error": None if approve else "Tool call rejected",
            "output": self.json_blob(200, 2000) if approve else None,
            "status": "completed" if approve else "failed",
        }
        return items + self.maybe_reasoning(0.5) + [call]

    def program_step(self) -> list[Item]:
        r = self.r
        pid = self.call_id().replace("call_", "prog_")
        program = {
            "id": self.hex_id("pg_"),
            "call_id": pid,
            "code": self.code(5, 25)[1],
            "fingerprint": self.hex_id("fp_", 16),
            "type": "program",
        }
        caller = {"type": "program", "caller_id": pid}
        children = [self.function_call(caller) for _ in range(r.randint(1, 3))]
        outputs = [self.function_output(c) for c in children]
        hosted: list[Item] = []
        if r.random() < 0.35:  # a program-owned hosted call
            ws, _ = self.web_search()
            hosted.append(dict(ws, caller=dict(caller)))
        status = "completed" if r.random() < 0.9 else "incomplete"
        done = {
            "id": self.hex_id("po_"),
            "call_id": pid,
            "result": self.json_blob(100, 800),
            "status": status,
            "type": "program_output",
        }
        return self.maybe_reasoning(0.9) + [program] + children + outputs + hosted + [done]

    def chat_completions_turn(self) -> list[Item]:
        """A turn answered by a Chat Completions model: every item carries the SDK's
        ``__fake_id__`` placeholder."""
        items = [self.user()]
        if self.r.random() < 0.6:
            call = dict(self.function_call(), id="__fake_id__")
            del call["status"]
            items += [call, self.function_output(call)]
        return items + [dict(self.message(), id="__fake_id__")]

    def agentic_step(self) -> tuple[list[Item], list[dict[str, Any]] | None]:
        """One step of an agentic turn: what one model response and its tools add."""
        r = self.r
        x = r.random()
        if x < 0.30:
            return self.function_step(), None
        if x < 0.46:
            call = self.shell_call()
            return self.maybe_reasoning() + [call] + self.shell_outputs(call), None
        if x < 0.52:
            ts_call, ts_out = self.tool_search()
            # search, its result and the call to a tool it found: one model response
            call = self.function_call()
            return self.maybe_reasoning() + [
                ts_call,
                ts_out,
                call,
                self.function_output(call),
            ], None
        if x < 0.56:
            return self.maybe_reasoning() + self.tool_search_streamed() + self.final(), None
        if x < 0.57:
            call, out = self.client_tool_search()
            return self.maybe_reasoning() + [call, out], None
        if x < 0.63:
            return self.mcp_step(), None
        return self.hosted_or_client_step(x)

    def hosted_or_client_step(self, x: float) -> tuple[list[Item], list[dict[str, Any]] | None]:
        """The rest of :meth:`agentic_step` (``x`` >= 0.63, drawn there): hosted tools and
        the client tools with one output each, else a program's step."""
        r = self.r
        if x < 0.68:
            ws, annotations = self.web_search()
            return self.maybe_reasoning() + [ws], annotations
        if x < 0.71:
            kind = r.choice(["file_search_call", "code_interpreter_call", "image_generation_call"])
            return self.maybe_reasoning() + [self.hosted_call(kind)], None
        paired = (
            (0.77, self.apply_patch),
            (0.81, self.custom_call),
            (0.84, self.computer_call),
            (0.87, self.local_shell),
        )
        for bound, make in paired:
            if x < bound:
                call, out = make()
                return self.maybe_reasoning() + [call, out], None
        return self.program_step(), None

    def agentic_turn(self) -> list[Item]:
        r = self.r
        if r.random() < 0.03:
            return self.chat_completions_turn()
        self.omit_reasoning_ids = r.random() < 0.1
        items: list[Item] = []
        x = r.random()
        if x < 0.02:
            items.append(self.compaction())
        elif x < 0.04:
            items.append(self.additional_tools())
        elif x < 0.06:
            items.append(self.configuration_update())
        if r.random() < 0.04:
            items.append(self.instructions())
        items.append(self.typed_message("user") if r.random() < 0.05 else self.user())
        annotations = None
        for _ in range(r.randint(1, 7)):
            step, found = self.agentic_step()
            items += step
            annotations = found or annotations
        items += self.final(annotations)
        self.omit_reasoning_ids = False
        return items

    def turn(self) -> list[Item]:
        if self.mix == "chat":
            return self.chat_turn()
        if self.mix == "tools":
            return self.tools_turn()
        return self.agentic_turn()

    def filler(self, k: int) -> list[Item]:
        """Exactly ``k`` items forming complete units: a user message and answers."""
        if k <= 0:
            return []
        items: list[Item] = [self.user()]
        while len(items) < k:
            if k - len(items) >= 2 and self.r.random() < 0.5:
                items += [self.reasoning(), self.message()]
            else:
                items.append(self.message())
        return items


def generate(n_items: int, mix: str = "agentic", seed: int = 0) -> list[Item]:
    """A session history of exactly ``n_items`` items (deterministic in its arguments)."""
    if n_items < 0:
        raise ValueError("n_items must be >= 0")
    g = _Gen(seed, mix)
    items: list[Item] = []
    while True:
        turn = g.turn()
        if len(items) + len(turn) > n_items:
            break
        items += turn
    items += g.filler(n_items - len(items))
    return items


def new_user_message(seed: int = 0) -> Item:
    """A fresh user message (the ``new_input`` of the next turn)."""
    return _Gen(seed, "chat", tag="new-input").user()


def next_turn(seed: int = 0, mix: str = "chat") -> list[Item]:
    """Three items one more turn adds to a session: user message, reasoning, answer.

    Ids are drawn from a separate stream, so they never collide with ``generate``'s.
    """
    g = _Gen(seed, mix, tag="next-turn")
    return [g.user(), g.reasoning(), g.message()]


def corpus_texts(total_bytes: int, seed: int = 0) -> list[str]:
    """Varied texts (English, Russian, code, JSON, base64) for token-counting throughput."""
    g = _Gen(seed, "agentic", tag="corpus")
    texts: list[str] = []
    size = 0
    makers = [
        g.user_text,
        g.answer_text,
        lambda: g.json_blob(500, 4000),
        lambda: g.code(5, 60)[1],
        g.encrypted,
        lambda: g.prose(5, 20, russian=1.0),
    ]
    i = 0
    while size < total_bytes:
        t = makers[i % len(makers)]()
        i += 1
        texts.append(t)
        size += len(t.encode("utf-8"))
    return texts


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    mix = sys.argv[2] if len(sys.argv) > 2 else "agentic"
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    json.dump(generate(n, mix, seed), sys.stdout, ensure_ascii=False)


def claude_thinking(item: Item) -> Item:
    """``item`` as the SDK's Chat Completions converter stores Claude's thinking (LiteLLM):
    the thinking text in ``content``, the blocks' signatures joined by ``"\\n"`` in
    ``encrypted_content``, the raw blocks (one redacted) in ``provider_data.thinking_blocks``
    (docs/item-graph.md §1.2)."""
    text = "\n\n".join(s["text"] for s in item.get("summary", [])) or "Thinking it over."
    payload = item["encrypted_content"]
    signatures = [payload[:120], payload[120:240] or payload[:60]]
    redacted = base64.b64encode(payload[-200:].encode()).decode()
    return {
        "id": "__fake_id__",
        "summary": [],
        "type": "reasoning",
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": "\n".join(signatures),
        "provider_data": {
            "model": "anthropic/claude-sonnet-4-5",
            "thinking_blocks": [
                {"type": "thinking", "thinking": text, "signature": signatures[0]},
                {"type": "redacted_thinking", "data": redacted},
                {"type": "thinking", "thinking": "", "signature": signatures[1]},
            ],
        },
    }
