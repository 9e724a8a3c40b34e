//! Masking: the model-facing copy of an old unit with its tool outputs cut to short excerpts
//! (observation masking), so the agent keeps its calls, arguments, reasoning and messages
//! when the bulky outputs that made a turn too big no longer fit.
//!
//! # Design note
//!
//! * **What is masked.** Only tool outputs ([`maskable`]): function, custom, shell, local
//!   shell, apply_patch and computer call outputs, a tool search's output (with or without
//!   `call_id`) and an `mcp_call`'s `output` field. Calls, arguments, reasoning (encrypted
//!   content included: it is never cut), messages, program results and hosted items other
//!   than `mcp_call` are sent as they are. The item graph does not change: ids, `call_id`s,
//!   `caller`s, types and statuses are kept, only payload fields are replaced, so every rule
//!   of `docs/item-graph.md` holds for a masked request exactly as for the unmasked one.
//! * **The copy of one output** ([`mask_unit`]). A text output (a string, or the text parts
//!   of a list output, or a shell output's `stdout` and `stderr` chunks) becomes a
//!   token-exact [`crate::truncate::excerpt`] of at most `excerpt_tokens` tokens: its head and
//!   tail around a marker that names the tool, the call id and how many tokens were removed
//!   ([`marker`]). Images and files of a list output are removed (the marker counts them and
//!   their tokens): the masked output is one string. A computer screenshot becomes a 1x1
//!   placeholder image ([`PLACEHOLDER_SCREENSHOT`]; the item has no text field for a marker).
//!   A tool search's output keeps its tool definitions with their prose removed (the
//!   descriptions emptied, schema `description` / `title` / `$comment` / `examples` dropped,
//!   as the SDK's own `ToolOutputTrimmer` does): the tools stay callable.
//! * **When a copy is used.** Only when it costs fewer tokens than the item ([`MaskedCosts`]
//!   compares the two exactly); otherwise the item is sent as it is.
//! * **Never stored, never changed.** The copies are new values; the caller's items are
//!   never touched, and the binding hands the copies out as new objects.
//! * **Costs.** [`MaskedCosts`] wraps a pack's [`CostSource`]: the masked cost of a unit is
//!   the exact cost of its copies (the items themselves where nothing is masked), kept per
//!   tool output in an index's [`MaskMemo`] for the next turn (for one encoding and one
//!   `excerpt_tokens`; anything else starts it afresh; [`MASK_RULE`] versions them in an
//!   index snapshot), and each tool output's masked field with its cost in the process-wide
//!   memo by content ([`crate::mask_cache`]: an unchanged output is cut and counted once per
//!   process, whichever pack or index meets it). Masked costs never exceed the whole ones, so a lower bound of the
//!   masked cost bounds both (the token window's walk,
//!   [`crate::indexed::IndexedHistory::window_start`]).

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::costs::{CostFailure, CostMemo, CostSource, UNCOUNTED};
use crate::items::{CallType, HostedKind, ItemKind};
use crate::mask_cache::{FieldCache, MASKED_FIELD_CACHE};
pub use crate::masked_field::{value_len, MaskedField, MASK_RULE};
use crate::tokens::{
    self, CostBasis, Encoding, OpaqueScale, TokenError, COST_RULE, COST_RULE_COMPATIBLE,
    ITEM_OVERHEAD,
};

/// What a masked cost depends on of a cost basis: the encoding, and under an estimate its
/// calibration (which scales every token there); elsewhere the calibration scales opaque
/// payloads only, which tool outputs do not carry.
pub fn mask_basis(basis: impl Into<CostBasis>) -> CostBasis {
    let basis = basis.into();
    if basis.scales_whole() {
        basis
    } else {
        CostBasis::from(basis.encoding)
    }
}
use crate::truncate::excerpt;

/// Default `excerpt_tokens`: a masked output keeps this many tokens (marker included).
pub const DEFAULT_EXCERPT_TOKENS: u64 = 64;
/// The smallest `excerpt_tokens` accepted: the short marker always fits in it.
pub const MIN_EXCERPT_TOKENS: u64 = 16;

/// A 1x1 grey PNG: a masked computer screenshot (255 tokens instead of up to 1445).
pub const PLACEHOLDER_SCREENSHOT: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB\
CAAAAAA6fptVAAAACklEQVR4nGNoAAAAggCBd81ytgAAAABJRU5ErkJggg==";

/// The only fields a masked copy changes: `output` (every masked output but a tool
/// search's) and `tools` (a tool search's output). Every other field is the item's own.
pub const MASKED_FIELDS: [&str; 2] = ["output", "tools"];

/// How a pack masks older tool outputs (see [`crate::pack`]'s note on the fill).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Masking {
    /// Tokens a masked text output keeps, marker included (at least [`MIN_EXCERPT_TOKENS`]).
    pub excerpt_tokens: u64,
    /// Outputs of units older than this many newest turns of the history are masked even
    /// when they would fit whole (`None`: only when they do not fit whole).
    pub after_turns: Option<u64>,
}

impl Masking {
    /// A masking with `excerpt_tokens` (at least [`MIN_EXCERPT_TOKENS`]: the error says so)
    /// and `after_turns`.
    pub fn checked(excerpt_tokens: u64, after_turns: Option<u64>) -> Result<Masking, String> {
        if excerpt_tokens < MIN_EXCERPT_TOKENS {
            return Err(format!(
                "masking.excerpt_tokens must be at least {MIN_EXCERPT_TOKENS}, got {excerpt_tokens}"
            ));
        }
        Ok(Masking {
            excerpt_tokens,
            after_turns,
        })
    }
}

impl Default for Masking {
    fn default() -> Self {
        Masking {
            excerpt_tokens: DEFAULT_EXCERPT_TOKENS,
            after_turns: None,
        }
    }
}

/// Whether items of `kind` are tool outputs that may be masked.
pub fn maskable(kind: ItemKind) -> bool {
    match kind {
        ItemKind::Output(ct) => !matches!(ct, CallType::Program | CallType::McpApprovalRequest),
        ItemKind::AnonToolSearchOutput | ItemKind::Hosted(HostedKind::McpCall) => true,
        _ => false,
    }
}

/// The marker of a masked output: `marker(tool, call_id, parts)(removed, short)`, `removed`
/// being the tokens the item's masked copy saves (the marker's own tokens counted). `parts`:
/// images and files removed with the text (named in the full form).
pub fn marker<'a>(tool: &'a str, call_id: &str, parts: usize) -> impl Fn(u64, bool) -> String + 'a {
    let call_id = call_id.to_string();
    move |removed: u64, short: bool| {
        if short {
            return format!("[… {removed} tokens masked …]");
        }
        let media = match parts {
            0 => String::new(),
            1 => ", 1 image or file".to_string(),
            n => format!(", {n} images or files"),
        };
        format!(
            "\n[… {removed} tokens{media} of this {tool} output (call {call_id}) masked by \
             protoprompt …]\n"
        )
    }
}

fn text_of<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

/// Tool names of the calls in a unit, by `call_id` (the first call wins).
fn tool_names<'a>(items: &[&'a Value]) -> FxHashMap<&'a str, &'a str> {
    let mut names = FxHashMap::default();
    for item in items {
        let Value::Object(m) = item else { continue };
        if !matches!(
            text_of(m, "type"),
            Some("function_call" | "custom_tool_call")
        ) {
            continue;
        }
        if let (Some(id), Some(name)) = (text_of(m, "call_id"), text_of(m, "name")) {
            names.entry(id).or_insert(name);
        }
    }
    names
}

/// The masked field of each of a unit's items, with the copy's exact cost: `Some` for each
/// tool output that has something to mask (see the module note), `None` for every other
/// item. `items` are all the unit's history members (the calls name the tools of their
/// outputs), `whole` their exact costs (a marker states how many tokens its item's copy
/// saves). A tool output masked before in this process, unchanged, is not masked again
/// ([`crate::mask_cache`]).
pub fn mask_unit_fields(
    items: &[&Value],
    whole: &[u64],
    enc: Encoding,
    excerpt_tokens: u64,
) -> Result<Vec<Option<MaskedField>>, (usize, TokenError)> {
    let names = tool_names(items);
    items
        .iter()
        .zip(whole)
        .enumerate()
        .map(|(i, (item, &w))| {
            remembered_field(item, w, &names, enc, excerpt_tokens).map_err(|e| (i, e))
        })
        .collect()
}

/// [`mask_item`] with the copy's cost counted, through the process-wide memo
/// ([`MASKED_FIELD_CACHE`]) for a tool output.
fn remembered_field(
    item: &Value,
    whole: u64,
    names: &FxHashMap<&str, &str>,
    enc: Encoding,
    limit: u64,
) -> Result<Option<MaskedField>, TokenError> {
    let Value::Object(map) = item else {
        return Ok(None);
    };
    if !text_of(map, "type").is_some_and(|t| MASKED_TYPES.contains(&t)) {
        return Ok(None);
    }
    let tool = names.get(marker_call_id(map)).copied();
    let key = FieldCache::key(item, whole, tool, enc, limit);
    if let Some(entry) = MASKED_FIELD_CACHE.get(&key) {
        return Ok(entry.map(|f| f.detached()));
    }
    let field = match mask_item(item, whole, names, enc, limit)? {
        Some(mut f) => {
            if f.cost.is_none() {
                f.cost = Some(tokens::item_cost(&f.apply(item), enc)?.total());
            }
            Some(f)
        }
        None => None,
    };
    MASKED_FIELD_CACHE.insert(key, field.as_ref().map(|f| Arc::new(f.detached())));
    Ok(field)
}

/// The item types [`mask_item`] may mask.
const MASKED_TYPES: [&str; 8] = [
    "tool_search_output",
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "apply_patch_call_output",
    "mcp_call",
    "shell_call_output",
    "computer_call_output",
];

/// The call id a marker names (and the key its unit's calls name the tool by).
fn marker_call_id(map: &Map<String, Value>) -> &str {
    text_of(map, "call_id")
        .or_else(|| text_of(map, "id"))
        .unwrap_or("?")
}

/// The masked copies of one unit's items ([`mask_unit_fields`] applied to the items, their
/// costs counted here).
pub fn mask_unit(
    items: &[&Value],
    enc: Encoding,
    excerpt_tokens: u64,
) -> Result<Vec<Option<Value>>, (usize, TokenError)> {
    let whole = items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            tokens::item_cost(v, enc)
                .map(|c| c.total())
                .map_err(|e| (i, e))
        })
        .collect::<Result<Vec<u64>, _>>()?;
    let fields = mask_unit_fields(items, &whole, enc, excerpt_tokens)?;
    Ok(items
        .iter()
        .zip(fields)
        .map(|(item, f)| f.map(|f| f.apply(item)))
        .collect())
}

/// A masked value with its copy's cost when counted ([`Masker::cut`]).
type Cut = Option<(Value, Option<u64>)>;

/// One output being masked: its item without the masked field, its whole cost, and the
/// marker's names. A candidate text is placed by the caller (`place`) into the field.
struct Masker<'a> {
    enc: Encoding,
    limit: u64,
    whole: u64,
    template: Map<String, Value>,
    field: &'static str,
    tool: &'a str,
    call_id: &'a str,
}

impl Masker<'_> {
    /// The tokens the copy with `value` in the field saves against the item (0 if none).
    fn saved(&self, value: Value) -> Result<u64, TokenError> {
        let mut copy = self.template.clone();
        copy.insert(self.field.to_string(), value);
        let cost = tokens::item_cost(&Value::Object(copy), self.enc)?.total();
        Ok(self.whole.saturating_sub(cost))
    }

    /// The excerpt of `text` for the field (`place` puts a candidate text into it);
    /// `parts`: images and files removed with it (forcing a cut).
    /// The masked value and, when it saves tokens, the copy's exact cost.
    fn cut(
        &self,
        text: &str,
        parts: usize,
        place: &dyn Fn(String) -> Value,
    ) -> Result<Option<(Value, Option<u64>)>, TokenError> {
        let marker = marker(self.tool, self.call_id, parts);
        let mut removed = |candidate: &str| self.saved(place(candidate.to_string()));
        let cut = excerpt(
            self.enc,
            text,
            self.limit,
            parts > 0,
            self.whole,
            &marker,
            &mut removed,
        )?;
        Ok(cut.map(|e| {
            let cost = (e.actual > 0).then(|| self.whole - e.actual);
            (place(e.text), cost)
        }))
    }
}

/// The masked field of one item (whole cost `whole`), if it is a tool output with
/// something to mask.
fn mask_item(
    item: &Value,
    whole: u64,
    names: &FxHashMap<&str, &str>,
    enc: Encoding,
    limit: u64,
) -> Result<Option<MaskedField>, TokenError> {
    let Value::Object(map) = item else {
        return Ok(None);
    };
    let Some(ty) = text_of(map, "type") else {
        return Ok(None);
    };
    if ty == "tool_search_output" {
        return Ok(tool_definitions(map.get("tools")).map(|value| MaskedField {
            field: "tools",
            value: Arc::new(value),
            original_len: map.get("tools").map_or(0, value_len),
            cost: None,
            converted: std::sync::OnceLock::new(),
        }));
    }
    let call_id = marker_call_id(map);
    let tool = match ty {
        "function_call_output" | "custom_tool_call_output" => names
            .get(call_id)
            .copied()
            .or_else(|| text_of(map, "name"))
            .unwrap_or(if ty == "function_call_output" {
                "function"
            } else {
                "custom tool"
            }),
        "local_shell_call_output" => "local_shell",
        "apply_patch_call_output" => "apply_patch",
        "mcp_call" => text_of(map, "name").unwrap_or("mcp"),
        "shell_call_output" => "shell",
        "computer_call_output" => "computer",
        _ => return Ok(None),
    };
    let mut template = map.clone();
    let original = template.remove("output");
    let masker = Masker {
        enc,
        limit,
        whole,
        template,
        field: "output",
        tool,
        call_id,
    };
    let as_text = |t: String| Value::String(t);
    let replaced = match (ty, &original) {
        ("computer_call_output", _) => screenshot(original.as_ref()).map(|v| (v, None)),
        ("shell_call_output", _) => shell_output(original.as_ref(), &masker)?,
        ("function_call_output" | "custom_tool_call_output", Some(Value::Array(parts))) => {
            parts_output(parts, &masker)?
        }
        (_, Some(Value::String(text))) => masker.cut(text, 0, &as_text)?,
        _ => None,
    };
    Ok(replaced.map(|(value, cost)| MaskedField {
        field: "output",
        value: Arc::new(value),
        original_len: original.as_ref().map_or(0, value_len),
        cost,
        converted: std::sync::OnceLock::new(),
    }))
}

/// A function or custom tool output given as a list of `input_text`, `input_image` and
/// `input_file` parts (anything else is left as it is): one text, images and files removed.
fn parts_output(parts: &[Value], masker: &Masker<'_>) -> Result<Cut, TokenError> {
    let mut texts: Vec<&str> = Vec::new();
    let mut removed_parts = 0usize;
    for part in parts {
        let Value::Object(p) = part else {
            return Ok(None);
        };
        match text_of(p, "type") {
            Some("input_text") => match text_of(p, "text") {
                Some(t) => texts.push(t),
                None => return Ok(None),
            },
            Some("input_image" | "input_file") => removed_parts += 1,
            _ => return Ok(None),
        }
    }
    masker.cut(&texts.join("\n"), removed_parts, &|t| Value::String(t))
}

/// A shell call output (chunks of `stdout`, `stderr` and an `outcome`): one chunk, the last
/// one's outcome, with the excerpt of every chunk's stdout and stderr as its stdout.
fn shell_output(output: Option<&Value>, masker: &Masker<'_>) -> Result<Cut, TokenError> {
    let Some(Value::Array(chunks)) = output else {
        return Ok(None);
    };
    let mut texts: Vec<&str> = Vec::new();
    let mut last = None;
    for chunk in chunks {
        let Value::Object(c) = chunk else {
            return Ok(None);
        };
        for key in ["stdout", "stderr"] {
            match c.get(key) {
                Some(Value::String(t)) if !t.is_empty() => texts.push(t),
                Some(Value::String(_)) | None => {}
                Some(_) => return Ok(None),
            }
        }
        last = Some(c);
    }
    let Some(last) = last else {
        return Ok(None);
    };
    let place = |t: String| {
        let mut chunk = last.clone();
        chunk.insert("stdout".to_string(), Value::String(t));
        chunk.insert("stderr".to_string(), Value::String(String::new()));
        Value::Array(vec![Value::Object(chunk)])
    };
    masker.cut(&texts.join("\n"), 0, &place)
}

fn screenshot(output: Option<&Value>) -> Option<Value> {
    let Some(Value::Object(shot)) = output else {
        return None;
    };
    if text_of(shot, "type") != Some("computer_screenshot") {
        return None;
    }
    let placeholder = Value::Object(Map::from_iter([
        (
            "type".to_string(),
            Value::String("computer_screenshot".to_string()),
        ),
        (
            "image_url".to_string(),
            Value::String(PLACEHOLDER_SCREENSHOT.to_string()),
        ),
    ]));
    (&placeholder != output.unwrap_or(&Value::Null)).then_some(placeholder)
}

/// JSON-schema keywords holding prose (dropped) and holding schemas (walked), as in the
/// SDK's `ToolOutputTrimmer`.
const PROSE: [&str; 4] = ["description", "title", "$comment", "examples"];
const SCHEMA_VALUE: [&str; 12] = [
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
];
const SCHEMA_LIST: [&str; 4] = ["allOf", "anyOf", "oneOf", "prefixItems"];
const SCHEMA_MAP: [&str; 6] = [
    "$defs",
    "definitions",
    "dependentSchemas",
    "patternProperties",
    "properties",
    "dependencies",
];

fn schema_or_same(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_schema(m)),
        other => other.clone(),
    }
}

/// A JSON schema without its prose; structure, types and names are kept.
fn strip_schema(schema: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in schema {
        let k = key.as_str();
        if PROSE.contains(&k) {
            continue;
        }
        let kept = match value {
            Value::Object(m) if SCHEMA_VALUE.contains(&k) => Value::Object(strip_schema(m)),
            Value::Array(list) if k == "items" || SCHEMA_LIST.contains(&k) => {
                Value::Array(list.iter().map(schema_or_same).collect())
            }
            Value::Object(m) if SCHEMA_MAP.contains(&k) => Value::Object(
                m.iter()
                    .map(|(name, sub)| (name.clone(), schema_or_same(sub)))
                    .collect(),
            ),
            other => other.clone(),
        };
        out.insert(key.clone(), kept);
    }
    out
}

/// One tool definition of a tool search's output without its prose.
fn strip_tool(tool: &Value) -> Value {
    let Value::Object(t) = tool else {
        return tool.clone();
    };
    let mut out = t.clone();
    if matches!(t.get("description"), Some(Value::String(_))) {
        out.insert("description".to_string(), Value::String(String::new()));
    }
    match (text_of(t, "type"), t.get("parameters"), t.get("tools")) {
        (Some("function"), Some(Value::Object(p)), _) => {
            out.insert("parameters".to_string(), Value::Object(strip_schema(p)));
        }
        (Some("namespace"), _, Some(Value::Array(nested))) => {
            out.insert(
                "tools".to_string(),
                Value::Array(nested.iter().map(strip_tool).collect()),
            );
        }
        _ => {}
    }
    Value::Object(out)
}

/// A tool search's tool definitions without their prose, if that changes anything.
fn tool_definitions(tools: Option<&Value>) -> Option<Value> {
    let Some(Value::Array(list)) = tools else {
        return None;
    };
    let stripped = Value::Array(list.iter().map(strip_tool).collect());
    (Some(&stripped) != tools).then_some(stripped)
}

/// The masked cost of every tool output ([`maskable`]) counted so far, for one encoding and
/// one `excerpt_tokens` (an index keeps it between turns; [`UNCOUNTED`] where not counted).
/// Only tool outputs are kept: another item's masked cost is its whole cost, kept by the
/// index's [`crate::costs::CostMemo`] under its own basis (a reasoning item's depends on
/// the calibration of opaque payloads, which a masked cost is not keyed by). Under an
/// estimate encoding a calibration scales the whole cost ([`CostBasis::cost`]), masked
/// copies too: the memo is then keyed by it as well ([`mask_basis`]).
#[derive(Debug, Clone, Default)]
pub struct MaskMemo {
    key: Option<(CostBasis, u64)>,
    costs: Vec<u64>,
    /// The masked field of every position counted masked whose copy is cheaper than it.
    fields: FxHashMap<usize, Arc<MaskedField>>,
    /// Approximate bytes held by `fields`.
    field_bytes: usize,
}

/// Equal when they hold the same masked costs under the same parameters (the masked fields
/// are derived from the items, and a memo loaded from a snapshot has none).
impl PartialEq for MaskMemo {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.costs == other.costs
    }
}

/// What a [`MaskMemo::switch`] replaced, for [`MaskMemo::restore`].
#[derive(Debug)]
pub struct SwitchedMasks(MaskMemo);

/// What an index snapshot carries for the masked costs, after the items and whole costs
/// (see [`crate::incremental::GraphIndex::to_snapshot`]'s extensions): the rules they were
/// counted under first ([`MASK_RULE`], then [`COST_RULE`], one byte each, so that a reader
/// of other rules drops them without decoding the rest), the encoding's name, the
/// `excerpt_tokens`, and each position's masked cost plus one (`UNCOUNTED` becomes 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskPayload {
    mask_rule: u8,
    cost_rule: u8,
    encoding: Option<String>,
    excerpt_tokens: u64,
    costs: Vec<u64>,
}

/// A snapshot's masked costs as read ([`MaskMemo::from_section`]).
#[derive(Debug)]
pub enum MaskSection {
    /// Loaded (a memo with no masked cost when the snapshot had none).
    Loaded(MaskMemo),
    /// Counted under other rules: not reused (why).
    Dropped(&'static str),
}

impl MaskMemo {
    pub fn new() -> MaskMemo {
        MaskMemo::default()
    }

    /// The encoding and `excerpt_tokens` the masked costs are counted under (`None`: none
    /// counted yet).
    pub fn key(&self) -> Option<(Encoding, u64)> {
        self.key.map(|(b, x)| (b.encoding, x))
    }

    /// The masked cost of `position` under `basis` (an encoding, or an estimate's with its
    /// calibration, see [`mask_basis`]) and `excerpt_tokens`, if counted.
    pub fn get(
        &self,
        position: usize,
        basis: impl Into<CostBasis>,
        excerpt_tokens: u64,
    ) -> Option<u64> {
        if self.key != Some((mask_basis(basis), excerpt_tokens)) {
            return None;
        }
        self.costs
            .get(position)
            .copied()
            .filter(|&c| c != UNCOUNTED)
    }

    /// The masked field of `position` kept with its masked cost (for the same parameters).
    pub fn field(
        &self,
        position: usize,
        basis: impl Into<CostBasis>,
        excerpt_tokens: u64,
    ) -> Option<&Arc<MaskedField>> {
        if self.key != Some((mask_basis(basis), excerpt_tokens)) {
            return None;
        }
        self.fields.get(&position)
    }

    /// Count under `encoding` and `excerpt_tokens` from now on, if the memo counts under
    /// others (forgetting what it counted): returns what it held, for
    /// [`MaskMemo::restore`] (`None`: nothing changed).
    pub fn switch(
        &mut self,
        basis: impl Into<CostBasis>,
        excerpt_tokens: u64,
    ) -> Option<SwitchedMasks> {
        let key = (mask_basis(basis), excerpt_tokens);
        if self.key == Some(key) {
            return None;
        }
        let fresh = MaskMemo {
            key: Some(key),
            ..MaskMemo::default()
        };
        Some(SwitchedMasks(std::mem::replace(self, fresh)))
    }

    /// Put back what a [`MaskMemo::switch`] replaced (if anything).
    pub fn restore(&mut self, switched: Option<SwitchedMasks>) {
        if let Some(SwitchedMasks(before)) = switched {
            *self = before;
        }
    }

    /// Count under `encoding` and `excerpt_tokens` for `len` positions (forgetting what was
    /// counted under anything else).
    fn prepare(&mut self, basis: CostBasis, excerpt_tokens: u64, len: usize) {
        self.switch(basis, excerpt_tokens);
        if self.costs.len() < len {
            self.costs.resize(len, UNCOUNTED);
        }
    }

    fn set(&mut self, position: usize, cost: u64, field: Option<Arc<MaskedField>>) {
        if let Some(c) = self.costs.get_mut(position) {
            *c = cost;
            if let Some(f) = field {
                self.field_bytes += f.heap_bytes();
                if let Some(old) = self.fields.insert(position, f) {
                    self.field_bytes -= old.heap_bytes();
                }
            }
        }
    }

    /// Keep the first `len` positions and give memory back down to `capacity` positions.
    pub fn shrink_back(&mut self, len: usize, capacity: usize) {
        self.truncate(len);
        self.costs.shrink_to(capacity);
    }

    /// Keep the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.costs.truncate(len);
        if self.fields.keys().any(|&p| p >= len) {
            let mut bytes = 0;
            self.fields.retain(|&p, f| {
                let keep = p < len;
                if keep {
                    bytes += f.heap_bytes();
                }
                keep
            });
            self.field_bytes = bytes;
        }
    }

    pub fn clear(&mut self) {
        self.costs.clear();
        self.fields.clear();
        self.field_bytes = 0;
    }

    pub fn capacity(&self) -> usize {
        self.costs.capacity()
    }

    /// Positions whose masked cost is counted, and those with a masked field kept (a copy
    /// cheaper than the item).
    pub fn counted(&self) -> (usize, usize) {
        let costs = self.costs.iter().filter(|&&c| c != UNCOUNTED).count();
        (costs, self.fields.len())
    }

    /// Bytes of memory held (the masked fields approximately).
    pub fn heap_bytes(&self) -> usize {
        self.costs.capacity() * std::mem::size_of::<u64>()
            + self.fields.capacity() * 16
            + self.field_bytes
    }

    /// What a snapshot stores for this memo (its masked costs; the masked fields are made
    /// again from the items when a pack needs them).
    /// Masked costs of an estimate under a calibration are not stored (the payload has no
    /// calibration to tell them apart): a snapshot then loads with none.
    pub fn payload(&self) -> MaskPayload {
        let key = self.key.filter(|(b, _)| b.opaque_scale == OpaqueScale::ONE);
        MaskPayload {
            mask_rule: MASK_RULE,
            cost_rule: COST_RULE,
            encoding: key.map(|(b, _)| b.encoding.name().to_string()),
            excerpt_tokens: key.map_or(0, |(_, x)| x),
            costs: match key {
                Some(_) => self.costs.iter().map(|c| c.wrapping_add(1)).collect(),
                None => Vec::new(),
            },
        }
    }

    /// The memo a snapshot's masked section `bytes` (a [`MaskPayload`], possibly followed by
    /// sections of later versions, ignored) stored for an index of `kinds.len()` positions
    /// whose whole costs are `whole`. Empty `bytes` (a snapshot written before masked costs
    /// were stored) load as no masked cost; masked costs counted under another
    /// [`MASK_RULE`] or [`COST_RULE`] are dropped ([`MaskSection::Dropped`]). `Err` says how
    /// the section is damaged — it is never trusted in part: it cannot be decoded, names an
    /// unknown encoding or an `excerpt_tokens` below [`MIN_EXCERPT_TOKENS`], covers more
    /// positions than the index, or holds a masked cost for an item that is not a tool
    /// output, below an item's overhead or above the item's whole cost.
    pub fn from_section(
        bytes: &[u8],
        kinds: &dyn Fn(usize) -> ItemKind,
        items: usize,
        whole: &CostMemo,
    ) -> Result<MaskSection, String> {
        if bytes.is_empty() {
            return Ok(MaskSection::Loaded(MaskMemo::new()));
        }
        let damaged = |e: postcard::Error| format!("masked costs cannot be decoded: {e}");
        let (rules, _) = postcard::take_from_bytes::<(u8, u8)>(bytes).map_err(damaged)?;
        if rules.0 != MASK_RULE || ![COST_RULE, COST_RULE_COMPATIBLE].contains(&rules.1) {
            return Ok(MaskSection::Dropped(OTHER_MASK_RULE));
        }
        let (payload, _later) = postcard::take_from_bytes::<MaskPayload>(bytes).map_err(damaged)?;
        let Some(name) = payload.encoding.as_deref() else {
            if payload.costs.is_empty() {
                return Ok(MaskSection::Loaded(MaskMemo::new()));
            }
            return Err("masked costs without an encoding".to_string());
        };
        let encoding = Encoding::from_name(name).map_err(|_| "masked costs: unknown encoding")?;
        if payload.excerpt_tokens < MIN_EXCERPT_TOKENS {
            return Err("masked costs: excerpt_tokens out of bounds".to_string());
        }
        if payload.costs.len() > items {
            return Err("masked costs do not match the items".to_string());
        }
        let costs: Vec<u64> = payload.costs.iter().map(|c| c.wrapping_sub(1)).collect();
        let whole_of = |p: usize| {
            whole
                .get(p)
                .filter(|_| whole.basis().map(mask_basis) == Some(mask_basis(encoding)))
        };
        for (p, &c) in costs.iter().enumerate() {
            if c == UNCOUNTED {
                continue;
            }
            if !maskable(kinds(p)) {
                return Err(format!(
                    "item {p} has a masked cost but is not a tool output"
                ));
            }
            if c < ITEM_OVERHEAD || whole_of(p).is_some_and(|w| c > w) {
                return Err(format!("item {p}'s masked cost is out of bounds"));
            }
        }
        Ok(MaskSection::Loaded(MaskMemo {
            key: Some((mask_basis(encoding), payload.excerpt_tokens)),
            costs,
            fields: FxHashMap::default(),
            field_bytes: 0,
        }))
    }
}

/// Why a snapshot's masked costs were not reused ([`MaskSection::Dropped`]).
pub const OTHER_MASK_RULE: &str =
    "masked costs counted under another masking or cost rule: counted again";

/// Supplies the items of a pack as JSON values (to make their masked copies).
pub trait ValueSource {
    /// The items at `positions` (global: history then new input), in order.
    fn item_values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure>;
}

impl<F: crate::costs::ItemSource, S: crate::costs::CountStore> ValueSource
    for crate::costs::CostEngine<'_, F, S>
{
    fn item_values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        self.items().values(positions)
    }
}

/// A [`CostSource`] that also costs units masked: the wrapped source's costs, plus
/// [`CostSource::masked_costs`] from the masked copies of the unit's items (see the module
/// note), kept with their masked fields in a [`MaskMemo`] when one is given (tool outputs
/// among the history positions below its length).
pub struct MaskedCosts<'a, C: CostSource + ValueSource> {
    inner: &'a mut C,
    encoding: Encoding,
    basis: CostBasis,
    excerpt_tokens: u64,
    memo: Option<&'a mut MaskMemo>,
    /// The kind of the item at a history position, when the caller knows.
    kinds: Option<&'a (dyn Fn(usize) -> ItemKind + Sync)>,
    /// Masked costs and fields of positions the memo does not hold.
    cache: FxHashMap<usize, (u64, Option<Arc<MaskedField>>)>,
    /// The tokenizer failure that ended the call, if one did, and its position.
    tokenizer_failure: Option<(usize, TokenError)>,
}

/// One member of a unit counted masked: its cost as sent, and its masked field when the
/// copy is cheaper than the item.
type Made = (u64, Option<Arc<MaskedField>>);

impl<'a, C: CostSource + ValueSource> MaskedCosts<'a, C> {
    /// Masked copies costed under `basis` (an [`Encoding`], or an estimate's with its
    /// calibration, which scales a masked copy's cost as it does the item's).
    pub fn new(inner: &'a mut C, basis: impl Into<CostBasis>, excerpt_tokens: u64) -> Self {
        let basis = mask_basis(basis);
        MaskedCosts {
            inner,
            encoding: basis.encoding,
            basis,
            excerpt_tokens,
            memo: None,
            kinds: None,
            cache: FxHashMap::default(),
            tokenizer_failure: None,
        }
    }

    /// Tell the kind of the item at each history position. Then only tool outputs
    /// ([`maskable`]) and the calls naming their tools are read to mask a unit, and every
    /// other item's masked cost is its whole cost, so the fill bounds a unit's masked cost
    /// by its other members' costs before it masks anything ([`CostSource::maskable`]).
    pub fn with_kinds(mut self, kinds: &'a (dyn Fn(usize) -> ItemKind + Sync)) -> Self {
        self.kinds = Some(kinds);
        self
    }

    /// Whether masking a unit needs the item at `position`: a tool output, or a call that
    /// may name an output's tool (every item when the kinds are not known).
    fn needed(&self, position: usize) -> bool {
        self.kinds.is_none_or(|k| {
            let kind = k(position);
            maskable(kind)
                || matches!(
                    kind,
                    ItemKind::Call(CallType::FunctionCall | CallType::CustomToolCall)
                )
        })
    }

    /// Keep the masked costs of the tool outputs among history positions `0..n_history` in
    /// `memo` across calls (only positions [`MaskedCosts::with_kinds`] tells are tool
    /// outputs: without the kinds, nothing is kept there).
    pub fn with_memo(mut self, memo: &'a mut MaskMemo, n_history: usize) -> Self {
        memo.prepare(self.basis, self.excerpt_tokens, n_history);
        self.memo = Some(memo);
        self
    }

    /// The wrapped source.
    pub fn inner(&mut self) -> &mut C {
        self.inner
    }

    /// The tokenizer failure that ended the call, if one did, with its position.
    pub fn tokenizer_failure(&self) -> Option<(usize, &TokenError)> {
        self.tokenizer_failure.as_ref().map(|(p, e)| (*p, e))
    }

    /// The masked cost of `position` if this call or the memo has it.
    pub fn known_masked(&self, position: usize) -> Option<u64> {
        self.memo
            .as_deref()
            .and_then(|m| m.get(position, self.basis, self.excerpt_tokens))
            .or_else(|| self.cache.get(&position).map(|(c, _)| *c))
    }

    fn known_field(&self, position: usize) -> Option<Arc<MaskedField>> {
        self.memo
            .as_deref()
            .and_then(|m| m.field(position, self.basis, self.excerpt_tokens))
            .or_else(|| self.cache.get(&position).and_then(|(_, f)| f.as_ref()))
            .cloned()
    }

    /// Whether the item at `position` is known to be a tool output (the kinds are given).
    fn known_output(&self, position: usize) -> bool {
        self.kinds.is_some_and(|k| maskable(k(position)))
    }

    /// Keep what `position` costs masked: in the memo for a history position known to be a
    /// tool output (see [`MaskMemo`]), for this call otherwise.
    fn remember(&mut self, position: usize, made: Made) {
        let output = self.known_output(position);
        match self.memo.as_deref_mut() {
            Some(m) if output && position < m.costs.len() => m.set(position, made.0, made.1),
            _ => {
                self.cache.insert(position, made);
            }
        }
    }

    /// What `position` costs as sent in a masked unit, if known: its masked cost, or for an
    /// item known not to be a tool output its whole cost.
    fn known_sent(&self, position: usize) -> Option<u64> {
        self.known_masked(position).or_else(|| {
            self.kinds
                .is_some_and(|k| !maskable(k(position)))
                .then(|| self.inner.known(position))
                .flatten()
        })
    }

    fn failure(&mut self, position: usize, e: TokenError) -> CostFailure {
        let failure = CostFailure {
            position,
            field: "(item)".to_string(),
            message: e.to_string(),
        };
        if matches!(e, TokenError::Tokenizer(_)) {
            self.tokenizer_failure = Some((position, e));
        }
        failure
    }

    /// Mask one unit's members: each one's exact cost as sent, with its masked field where
    /// the copy costs less than the item.
    fn make(&mut self, members: &[usize]) -> Result<Vec<Made>, CostFailure> {
        let whole = self.inner.costs(members)?;
        let read: Vec<usize> = (0..members.len())
            .filter(|&i| self.needed(members[i]))
            .collect();
        let positions: Vec<usize> = read.iter().map(|&i| members[i]).collect();
        let values = self.inner.item_values(&positions)?;
        let refs: Vec<&Value> = values.iter().collect();
        // The masker works on the encoding's own costs; a calibrated estimate's are scaled.
        let read_whole: Vec<u64> = if self.basis == CostBasis::from(self.encoding) {
            read.iter().map(|&i| whole[i]).collect()
        } else {
            let mut raw = Vec::with_capacity(read.len());
            for (&p, v) in positions.iter().zip(&values) {
                raw.push(
                    tokens::item_cost(v, self.encoding)
                        .map_err(|e| self.failure(p, e))?
                        .total(),
                );
            }
            raw
        };
        let fields = mask_unit_fields(&refs, &read_whole, self.encoding, self.excerpt_tokens)
            .map_err(|(i, e)| self.failure(positions[i], e))?;
        let mut by_member: Vec<Option<(MaskedField, &Value)>> = std::iter::repeat_with(|| None)
            .take(members.len())
            .collect();
        for ((i, field), item) in read.iter().zip(fields).zip(&values) {
            by_member[*i] = field.map(|f| (f, item));
        }
        let mut out = Vec::with_capacity(members.len());
        for ((&p, w), masked) in members.iter().zip(whole).zip(by_member) {
            let Some((field, item)) = masked else {
                out.push((w, None));
                continue;
            };
            let raw = match field.cost {
                Some(c) => c,
                None => tokens::item_cost(&field.apply(item), self.encoding)
                    .map_err(|e| self.failure(p, e))?
                    .total(),
            };
            let cost = self.basis.whole(raw);
            if cost < w {
                out.push((cost, Some(Arc::new(field))));
            } else {
                out.push((w, None));
            }
        }
        Ok(out)
    }

    /// The masked fields of the units `units` (history members of each) that the pack kept
    /// masked: `(position, field)` for every member sent masked, in position order. Fields
    /// counted earlier (this call or the memo) are reused; the others are made again, and a
    /// masked cost that is not what the pack counted (the item changed since) is an error.
    pub fn copies(
        &mut self,
        units: &[&[usize]],
    ) -> Result<Vec<(usize, Arc<MaskedField>)>, CostFailure> {
        let mut out = Vec::new();
        for members in units {
            let whole = self.inner.costs(members)?;
            let masked = |s: &Self, p: usize, w: u64| s.known_masked(p).is_some_and(|c| c < w);
            let complete = members
                .iter()
                .zip(&whole)
                .all(|(&p, &w)| !masked(self, p, w) || self.known_field(p).is_some());
            if complete {
                for (&p, &w) in members.iter().zip(&whole) {
                    if let Some(f) = self.known_field(p).filter(|_| masked(self, p, w)) {
                        out.push((p, f));
                    }
                }
                continue;
            }
            let made = self.make(members)?;
            for (&p, (cost, field)) in members.iter().zip(made) {
                if self.known_masked(p).is_some_and(|k| k != cost) {
                    return Err(CostFailure {
                        position: p,
                        field: "(item)".to_string(),
                        message: "changed since its cost was counted (the items an index \
                                  has seen must stay as they are)"
                            .to_string(),
                    });
                }
                if let Some(f) = &field {
                    out.push((p, Arc::clone(f)));
                }
                self.remember(p, (cost, field));
            }
        }
        out.sort_by_key(|(p, _)| *p);
        Ok(out)
    }
}

impl<C: CostSource + ValueSource> CostSource for MaskedCosts<'_, C> {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        self.inner.costs(positions)
    }

    fn lower_bound(&mut self, position: usize) -> u64 {
        self.inner.lower_bound(position)
    }

    fn masked_costs(&mut self, members: &[usize]) -> Result<Vec<u64>, CostFailure> {
        if members.iter().all(|&p| self.known_sent(p).is_some()) {
            return Ok(members
                .iter()
                .map(|&p| self.known_sent(p).unwrap_or(0))
                .collect());
        }
        let made = self.make(members)?;
        let mut out = Vec::with_capacity(members.len());
        for (&p, m) in members.iter().zip(made) {
            out.push(m.0);
            self.remember(p, m);
        }
        Ok(out)
    }

    fn known(&self, position: usize) -> Option<u64> {
        self.inner.known(position)
    }

    fn maskable(&self, position: usize) -> bool {
        self.kinds.is_none_or(|k| maskable(k(position)))
    }

    fn masks(&self) -> bool {
        true
    }
}

/// A [`CostSource`] for a masked pack that leaves earlier turns' reasoning out of the
/// request: the positions in `omitted` (reasoning items before the last user message, chosen
/// by the caller, [`crate::costs::omittable_reasoning`]) cost 0 *masked*, and the positions in
/// `stripped` (the model items of their units the caller sends without `id`,
/// [`crate::costs::id_optional_follower`]) cost exactly what their copy without `id` costs;
/// both count as maskable, so a unit sent masked is counted as it is sent. Whole, every
/// position costs what `inner` says. Built per pack call from positions (never memoized, as
/// [`crate::costs::EarlierThinkingFree`] is); the copies' costs are kept for the call.
pub struct ReasoningOmitted<'a, C: CostSource + ValueSource> {
    inner: &'a mut C,
    omitted: Vec<usize>,
    stripped: Vec<usize>,
    basis: CostBasis,
    without_id: FxHashMap<usize, u64>,
}

impl<'a, C: CostSource + ValueSource> ReasoningOmitted<'a, C> {
    /// `omitted` and `stripped` in any order; `basis` as the pack's costs.
    pub fn new(
        inner: &'a mut C,
        mut omitted: Vec<usize>,
        mut stripped: Vec<usize>,
        basis: impl Into<CostBasis>,
    ) -> Self {
        omitted.sort_unstable();
        omitted.dedup();
        stripped.sort_unstable();
        stripped.dedup();
        ReasoningOmitted {
            inner,
            omitted,
            stripped,
            basis: basis.into(),
            without_id: FxHashMap::default(),
        }
    }

    /// Whether the item at `position` is left out of a masked unit.
    pub fn is_omitted(&self, position: usize) -> bool {
        self.omitted.binary_search(&position).is_ok()
    }

    fn is_stripped(&self, position: usize) -> bool {
        self.stripped.binary_search(&position).is_ok()
    }

    /// The exact costs of `positions` (stripped ones) sent without `id`: the item's whole
    /// cost less the tokens its `id` adds.
    fn stripped_costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        let missing: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|p| !self.without_id.contains_key(p))
            .collect();
        if !missing.is_empty() {
            let whole = self.inner.costs(&missing)?;
            let values = self.inner.item_values(&missing)?;
            let enc = self.basis.encoding;
            for ((&p, w), v) in missing.iter().zip(whole).zip(values) {
                let failure = |e: TokenError| CostFailure {
                    position: p,
                    field: "(item)".to_string(),
                    message: e.to_string(),
                };
                let cost = match &v {
                    Value::Object(map) if map.contains_key("id") => {
                        let mut copy = map.clone();
                        copy.remove("id");
                        let with = tokens::item_cost(&v, enc).map_err(failure)?.total();
                        let without = tokens::item_cost(&Value::Object(copy), enc)
                            .map_err(failure)?
                            .total();
                        w.saturating_sub(self.basis.whole(with.saturating_sub(without)))
                    }
                    _ => w,
                };
                self.without_id.insert(p, cost);
            }
        }
        Ok(positions
            .iter()
            .map(|p| self.without_id.get(p).copied().unwrap_or_default())
            .collect())
    }
}

impl<C: CostSource + ValueSource> CostSource for ReasoningOmitted<'_, C> {
    fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
        self.inner.costs(positions)
    }

    fn lower_bound(&mut self, position: usize) -> u64 {
        self.inner.lower_bound(position)
    }

    fn masked_costs(&mut self, members: &[usize]) -> Result<Vec<u64>, CostFailure> {
        let (special, counted): (Vec<usize>, Vec<usize>) = members
            .iter()
            .partition(|&&p| self.is_omitted(p) || self.is_stripped(p));
        let stripped: Vec<usize> = special
            .iter()
            .copied()
            .filter(|&p| !self.is_omitted(p))
            .collect();
        let mut stripped_costs = self.stripped_costs(&stripped)?.into_iter();
        let mut costs = self.inner.masked_costs(&counted)?.into_iter();
        Ok(members
            .iter()
            .map(|&p| {
                if self.is_omitted(p) {
                    0
                } else if self.is_stripped(p) {
                    stripped_costs.next().unwrap_or(0)
                } else {
                    costs.next().unwrap_or(0)
                }
            })
            .collect())
    }

    fn masked_lower_bound(&mut self, position: usize) -> u64 {
        if self.is_omitted(position) {
            0
        } else {
            self.inner.masked_lower_bound(position)
        }
    }

    fn masks(&self) -> bool {
        self.inner.masks() || !self.omitted.is_empty()
    }

    fn known(&self, position: usize) -> Option<u64> {
        self.inner.known(position)
    }

    fn maskable(&self, position: usize) -> bool {
        self.is_omitted(position) || self.is_stripped(position) || self.inner.maskable(position)
    }
}

impl<C: CostSource + ValueSource> ValueSource for MaskedCosts<'_, C> {
    fn item_values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
        self.inner.item_values(positions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Items as JSON values, costed whole by `tokens::item_cost` (o200k_base).
    struct Values(Vec<Value>);

    impl CostSource for Values {
        fn costs(&mut self, positions: &[usize]) -> Result<Vec<u64>, CostFailure> {
            Ok(positions
                .iter()
                .map(|&p| {
                    tokens::item_cost(&self.0[p], Encoding::O200kBase)
                        .unwrap()
                        .total()
                })
                .collect())
        }
    }

    impl ValueSource for Values {
        fn item_values(&mut self, positions: &[usize]) -> Result<Vec<Value>, CostFailure> {
            Ok(positions.iter().map(|&p| self.0[p].clone()).collect())
        }
    }

    #[test]
    fn omitted_reasoning_costs_nothing_and_stripped_items_lose_their_ids_tokens() {
        let call = json!({"type": "function_call", "id": "fc_0123456789abcdef0123456789",
                          "call_id": "c1", "name": "f", "arguments": "{}"});
        let mut bare = call.clone();
        bare.as_object_mut().unwrap().remove("id");
        let items = vec![
            json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}),
            call.clone(),
            json!({"type": "function_call_output", "call_id": "c1", "output": "ok"}),
        ];
        let whole: Vec<u64> = items
            .iter()
            .map(|v| tokens::item_cost(v, Encoding::O200kBase).unwrap().total())
            .collect();
        let bare_cost = tokens::item_cost(&bare, Encoding::O200kBase)
            .unwrap()
            .total();
        assert!(bare_cost < whole[1]);
        let mut inner = Values(items);
        let mut om = ReasoningOmitted::new(&mut inner, vec![0], vec![1], Encoding::O200kBase);
        assert_eq!(om.costs(&[0, 1, 2]).unwrap(), whole);
        assert_eq!(
            om.masked_costs(&[0, 1, 2]).unwrap(),
            vec![0, bare_cost, whole[2]]
        );
        assert_eq!(om.masked_lower_bound(0), 0);
        assert!(om.maskable(0) && om.maskable(1) && om.masks());
    }

    const ENC: Encoding = Encoding::O200kBase;

    #[test]
    fn a_masking_needs_room_for_its_marker() {
        assert_eq!(
            Masking::checked(MIN_EXCERPT_TOKENS, Some(2)),
            Ok(Masking {
                excerpt_tokens: MIN_EXCERPT_TOKENS,
                after_turns: Some(2)
            })
        );
        let err = Masking::checked(MIN_EXCERPT_TOKENS - 1, None).unwrap_err();
        assert!(
            err.starts_with("masking.excerpt_tokens must be at least"),
            "{err}"
        );
    }

    fn long(n: usize) -> String {
        "the quick brown fox jumps over the lazy dog 42 times\n".repeat(n)
    }

    fn masked(items: &[Value], limit: u64) -> Vec<Option<Value>> {
        let refs: Vec<&Value> = items.iter().collect();
        mask_unit(&refs, ENC, limit).unwrap()
    }

    #[test]
    fn a_long_function_output_becomes_an_excerpt_naming_tool_and_call() {
        let items = [
            json!({"type":"function_call","call_id":"c1","name":"grep","arguments":"{}"}),
            json!({"type":"function_call_output","call_id":"c1","output": long(200),
                   "caller": {"type":"direct"}}),
        ];
        let out = masked(&items, 64);
        assert!(out[0].is_none(), "calls are never masked");
        let copy = out[1].as_ref().unwrap();
        let text = copy["output"].as_str().unwrap();
        assert!(ENC.count(text).unwrap() <= 64);
        assert!(text.contains("of this grep output (call c1) masked by protoprompt"));
        let saved = tokens::item_cost(&items[1], ENC).unwrap().total()
            - tokens::item_cost(copy, ENC).unwrap().total();
        assert!(
            text.contains(&format!("[… {saved} tokens of this grep")),
            "{text}"
        );
        assert!(text.starts_with("the quick brown fox"));
        assert_eq!(copy["caller"], items[1]["caller"], "graph fields are kept");
        assert_eq!(copy["call_id"], "c1");
        // A short output has nothing to mask.
        let short = [json!({"type":"function_call_output","call_id":"c1","output":"ok"})];
        assert_eq!(masked(&short, 64), vec![None]);
    }

    #[test]
    fn images_and_files_are_removed_and_counted_in_the_marker() {
        let items = [
            json!({"type":"function_call_output","call_id":"c2","output":[
                {"type":"input_text","text":"chart attached"},
                {"type":"input_image","image_url":"https://example.com/x.png"},
                {"type":"input_file","file_id":"file_1"},
            ]}),
        ];
        let copy = masked(&items, 64)[0].clone().unwrap();
        let text = copy["output"].as_str().unwrap();
        assert!(text.starts_with("chart attached"), "{text}");
        assert!(text.contains("2 images or files of this function output (call c2)"));
        // The marker states the tokens the copy saves: the item's cost less the copy's.
        let saved = tokens::item_cost(&items[0], ENC).unwrap().total()
            - tokens::item_cost(&copy, ENC).unwrap().total();
        let media = tokens::IMAGE_MAX_TOKENS + tokens::UNKNOWN_FILE_TOKENS;
        assert!(
            saved < media && saved > media - 50,
            "the marker's own tokens: {saved}"
        );
        assert!(text.contains(&format!("… {saved} tokens")), "{text}");
        // Unknown parts: left as they are.
        let odd = [json!({"type":"function_call_output","call_id":"c2","output":[{"type":"x"}]})];
        assert_eq!(masked(&odd, 64), vec![None]);
    }

    #[test]
    fn every_kind_of_tool_output_has_a_masked_form_with_its_graph_fields() {
        let out = long(100);
        let items = [
            json!({"type":"custom_tool_call_output","call_id":"k","output":out}),
            json!({"type":"local_shell_call_output","call_id":"l","output":out}),
            json!({"type":"apply_patch_call_output","call_id":"a","status":"completed",
                   "output":out}),
            json!({"type":"mcp_call","id":"mcp_1","name":"lookup","server_label":"crm",
                   "arguments":"{}","status":"completed","output":out}),
            json!({"type":"shell_call_output","call_id":"s","output":[
                {"stdout":out,"stderr":"warn","outcome":{"type":"exit","exit_code":0}},
                {"stdout":"tail","stderr":"","outcome":{"type":"exit","exit_code":3}}]}),
            json!({"type":"computer_call_output","call_id":"u","output":
                {"type":"computer_screenshot","file_id":"file_9"}}),
            json!({"type":"tool_search_output","call_id":"t","execution":"client",
                   "status":"completed","tools":[{"type":"function","name":"crm_find",
                   "description":out,"strict":true,"parameters":{"type":"object",
                   "properties":{"q":{"type":"string","description":"query"}},
                   "required":["q"]}}]}),
        ];
        let copies = masked(&items, 64);
        for (item, copy) in items.iter().zip(&copies) {
            let copy = copy.as_ref().unwrap_or_else(|| panic!("{item}"));
            let (a, b) = (item.as_object().unwrap(), copy.as_object().unwrap());
            assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
            for (k, v) in a {
                if !MASKED_FIELDS.contains(&k.as_str()) {
                    assert_eq!(Some(v), b.get(k), "{k}");
                }
            }
        }
        assert!(copies[3].as_ref().unwrap()["output"]
            .as_str()
            .unwrap()
            .contains("lookup output (call mcp_1)"));
        let shell = &copies[4].as_ref().unwrap()["output"];
        assert_eq!(shell.as_array().unwrap().len(), 1);
        assert_eq!(
            shell[0]["outcome"]["exit_code"], 3,
            "the last outcome is kept"
        );
        assert!(shell[0]["stdout"]
            .as_str()
            .unwrap()
            .contains("shell output (call s)"));
        assert_eq!(
            copies[5].as_ref().unwrap()["output"]["image_url"],
            PLACEHOLDER_SCREENSHOT
        );
        let tool = &copies[6].as_ref().unwrap()["tools"][0];
        assert_eq!(tool["description"], "");
        assert_eq!(tool["name"], "crm_find");
        assert_eq!(
            tool["parameters"],
            json!({"type":"object","properties":{"q":{"type":"string"}},"required":["q"]})
        );
    }

    #[test]
    fn an_unchanged_output_is_masked_once_per_process_and_a_changed_one_again() {
        use crate::mask_cache::MASKED_FIELD_CACHE;
        // Content of this test alone (the memo is process-wide; tests run in parallel).
        let out = format!("{}{}", long(60), "memo test 7c1d");
        let call = json!({"type":"function_call","call_id":"m1","name":"grep","arguments":"{}"});
        let output = json!({"type":"function_call_output","call_id":"m1","output": out});
        let items = [call.clone(), output.clone()];
        let first = masked(&items, 64);
        let whole = tokens::item_cost(&output, ENC).unwrap().total();
        let key = FieldCache::key(&output, whole, Some("grep"), ENC, 64);
        let kept = MASKED_FIELD_CACHE
            .get(&key)
            .expect("kept by content")
            .unwrap();
        assert_eq!(Some(kept.apply(&output)), first[1], "with its exact cost");
        assert_eq!(
            kept.cost,
            Some(
                tokens::item_cost(&kept.apply(&output), ENC)
                    .unwrap()
                    .total()
            )
        );
        // The fast path is taken: a planted field under the key is what the next mask gives.
        let planted = MaskedField {
            value: Arc::new(json!("planted")),
            ..kept.detached()
        };
        MASKED_FIELD_CACHE.insert(key, Some(Arc::new(planted)));
        assert_eq!(masked(&items, 64)[1].as_ref().unwrap()["output"], "planted");
        // Anything the copy depends on changed: masked afresh, never the planted field.
        let mut edited = output.clone();
        edited["output"] = json!(format!("{out}!"));
        let mut renamed = call.clone();
        renamed["name"] = json!("find");
        for (items, limit) in [
            ([call.clone(), edited], 64),
            ([renamed, output.clone()], 64),
            ([call.clone(), output.clone()], 65),
        ] {
            let copy = masked(&items, limit)[1].clone().unwrap();
            assert_ne!(copy["output"], "planted", "{}", items[1]);
            let refs: Vec<&Value> = items.iter().collect();
            let w = tokens::item_cost(&items[1], ENC).unwrap().total();
            let fresh = mask_item(&items[1], w, &tool_names(&refs), ENC, limit).unwrap();
            assert_eq!(
                copy,
                fresh.unwrap().apply(&items[1]),
                "as masked the first time"
            );
        }
    }

    #[test]
    fn only_tool_outputs_are_maskable() {
        use crate::items::ItemMeta;
        let cases = [
            (
                json!({"type":"function_call_output","call_id":"c","output":"x"}),
                true,
            ),
            (
                json!({"type":"shell_call_output","call_id":"c","output":[]}),
                true,
            ),
            (
                json!({"type":"tool_search_output","id":"t","tools":[]}),
                true,
            ),
            (
                json!({"type":"mcp_call","id":"m","name":"n","server_label":"s",
                    "arguments":"{}"}),
                true,
            ),
            (
                json!({"type":"program_output","call_id":"p","result":"r",
                    "status":"completed"}),
                false,
            ),
            (
                json!({"type":"mcp_approval_response","approval_request_id":"r",
                    "approve":true}),
                false,
            ),
            (
                json!({"type":"function_call","call_id":"c","name":"f","arguments":"{}"}),
                false,
            ),
            (
                json!({"type":"reasoning","id":"r","summary":[],"encrypted_content":"e"}),
                false,
            ),
            (json!({"role":"user","content":"hi"}), false),
            (
                json!({"type":"web_search_call","id":"w","status":"completed"}),
                false,
            ),
        ];
        for (item, expected) in cases {
            let kind = ItemMeta::from_json(&item).unwrap().kind;
            assert_eq!(maskable(kind), expected, "{item}");
            if !expected {
                // Whatever its fields, an item of another kind never gets a copy.
                let mut big = item.clone();
                big["output"] = json!(long(50));
                big["result"] = json!(long(50));
                let names = FxHashMap::default();
                assert_eq!(
                    mask_item(&big, 10_000, &names, ENC, 16).unwrap(),
                    None,
                    "{item}"
                );
            }
        }
    }
}
