//! Extraction and classification of single Responses input items (docs/item-graph.md §1, §12.1).
//!
//! [`RawItem::from_json`] pulls the graph-relevant fields out of one JSON item without
//! interpreting them; [`classify`] turns them into an [`ItemMeta`] that the graph builder
//! (`crate::graph`) works on. Payload fields (`arguments`, `output`, `content`, …) are never
//! looked at here. Sections (§) cited in this module are those of docs/item-graph.md.

use std::fmt;

use serde_json::{Map, Value};

/// The SDK's placeholder id for Chat-Completions-backed models (deleted before sending).
pub const FAKE_ID: &str = "__fake_id__";

/// Graph-relevant raw fields of one item, extracted without interpreting them.
///
/// `None` = absent or JSON null. Extraction fails ([`ItemError`]) for: item not a JSON object;
/// any of type/role/id/call_id/status/execution/approval_request_id present with a non-string,
/// non-null value; `caller` present, non-null and not an object; caller.type or
/// caller.caller_id present with a non-string, non-null value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawItem {
    pub item_type: Option<String>,
    pub role: Option<String>,
    pub id: Option<String>,
    pub call_id: Option<String>,
    pub status: Option<String>,
    pub execution: Option<String>,
    pub approval_request_id: Option<String>,
    pub caller: Option<RawCaller>,
    /// `encrypted_content` is a non-empty string.
    pub has_encrypted_content: bool,
    /// `provider_data` present and non-null.
    pub has_provider_data: bool,
    /// `tool_calls` present and non-null (Chat Completions shape).
    pub has_tool_calls: bool,
    /// `tool_call_id` present (role:"tool" shape).
    pub has_tool_call_id: bool,
    /// `provider_data.type` if it is a string (for the `hosted_tool_call` wrapper).
    pub provider_data_type: Option<String>,
}

/// The `caller` object of an item: `{"type":"direct"}` or
/// `{"type":"program","caller_id":"<program call_id>"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawCaller {
    pub caller_type: Option<String>,
    pub caller_id: Option<String>,
}

/// A malformed item. `field` names the offending field ("item" for the item itself,
/// "caller.caller_id" for nested fields); the item index is added by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ItemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ItemError {}

/// Why a front end's value cannot be read (a JSON source's usual `Error`): the
/// field (a path inside the item), what is wrong with it, and the front end's own failure
/// behind it if there was one (a Python exception: the error's cause).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault<C> {
    pub field: String,
    pub message: String,
    pub cause: Option<C>,
}

impl<C> Fault<C> {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Fault {
            field: field.into(),
            message: message.into(),
            cause: None,
        }
    }

    /// The front end's failure `cause` at `field`, with `message`.
    pub fn caused(field: impl Into<String>, message: impl Into<String>, cause: C) -> Self {
        Fault {
            cause: Some(cause),
            ..Fault::new(field, message)
        }
    }

    /// The front end's failure `cause` at `field`, its own text the message.
    pub fn raised(field: impl Into<String>, cause: C) -> Self
    where
        C: fmt::Display,
    {
        let message = cause.to_string();
        Fault::caused(field, message, cause)
    }
}

impl<C> From<ItemError> for Fault<C> {
    fn from(e: ItemError) -> Self {
        Fault::new(e.field, e.message)
    }
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The top-level fields of an item that the graph reads: every front end (JSON here, Python
/// objects in the binding) finds these in an item and hands them to [`ItemFields::read`], the
/// one reader that interprets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphField {
    Type,
    Role,
    Id,
    CallId,
    Status,
    Execution,
    ApprovalRequestId,
    Caller,
    EncryptedContent,
    ProviderData,
    ToolCalls,
    ToolCallId,
}

impl GraphField {
    pub const COUNT: usize = 12;

    /// The field's key in an item.
    pub fn name(self) -> &'static str {
        match self {
            GraphField::Type => "type",
            GraphField::Role => "role",
            GraphField::Id => "id",
            GraphField::CallId => "call_id",
            GraphField::Status => "status",
            GraphField::Execution => "execution",
            GraphField::ApprovalRequestId => "approval_request_id",
            GraphField::Caller => "caller",
            GraphField::EncryptedContent => "encrypted_content",
            GraphField::ProviderData => "provider_data",
            GraphField::ToolCalls => "tool_calls",
            GraphField::ToolCallId => "tool_call_id",
        }
    }

    /// The field an item key names, if the graph reads it.
    pub fn from_name(key: &str) -> Option<GraphField> {
        // A `match` compiles to a length switch and one comparison per candidate.
        Some(match key {
            "type" => GraphField::Type,
            "role" => GraphField::Role,
            "id" => GraphField::Id,
            "call_id" => GraphField::CallId,
            "status" => GraphField::Status,
            "execution" => GraphField::Execution,
            "approval_request_id" => GraphField::ApprovalRequestId,
            "caller" => GraphField::Caller,
            "encrypted_content" => GraphField::EncryptedContent,
            "provider_data" => GraphField::ProviderData,
            "tool_calls" => GraphField::ToolCalls,
            "tool_call_id" => GraphField::ToolCallId,
            _ => return None,
        })
    }
}

/// A string value whose text cannot be read (a Python `str` with a lone surrogate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotText;

/// One value inside an item as a front end holds it: what [`ItemFields::read`] needs to ask
/// of it. A front end's own failures (a Python mapping whose `items()` raises) are its
/// `Error`, which must also carry the reader's [`ItemError`]s.
pub trait ItemValue: Sized {
    type Error: From<ItemError>;
    /// A mapping value opened for lookups ([`ItemValue::mapping`]).
    type Map;

    /// JSON null / Python None.
    fn is_null(&self) -> bool;
    /// `None`: not a string; `Some(Err)`: a string that is not valid text.
    fn text(&self) -> Option<Result<&str, NotText>>;
    /// The value's type, for messages ("int", "list"; "number", "array" for JSON).
    fn type_name(&self) -> String;
    /// The value opened as a mapping; `Ok(None)`: it is not one. `field` names it in errors.
    fn mapping(&self, field: &str) -> Result<Option<Self::Map>, Self::Error>;
    /// The entry `key` of a mapping (absent: `None`). `field` names it in errors.
    fn entry(map: &Self::Map, key: &str, field: &str) -> Result<Option<Self>, Self::Error>;
}

/// The graph fields of one item as a front end found them (absent ones `None`), to be read
/// by [`ItemFields::read`].
#[derive(Debug)]
pub struct ItemFields<V> {
    values: [Option<V>; GraphField::COUNT],
}

impl<V> Default for ItemFields<V> {
    fn default() -> Self {
        ItemFields {
            values: std::array::from_fn(|_| None),
        }
    }
}

impl<V> ItemFields<V> {
    pub fn set(&mut self, field: GraphField, value: V) {
        self.values[field as usize] = Some(value);
    }

    pub fn get(&self, field: GraphField) -> Option<&V> {
        self.values[field as usize].as_ref()
    }
}

/// `Ok(None)` when absent or null, `Ok(Some)` for a string, error otherwise.
fn opt_string<V: ItemValue>(value: Option<&V>, field: &str) -> Result<Option<String>, V::Error> {
    let Some(v) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.text() {
        Some(Ok(s)) => Ok(Some(s.to_string())),
        Some(Err(NotText)) => Err(ItemError::new(field, "is not valid UTF-8 text").into()),
        None => {
            Err(ItemError::new(field, format!("must be a string, got {}", v.type_name())).into())
        }
    }
}

impl<V: ItemValue> ItemFields<V> {
    /// Extract the graph-relevant fields (see [`RawItem`] for the error cases).
    pub fn read(&self) -> Result<RawItem, V::Error> {
        let field = |f: GraphField| opt_string(self.get(f), f.name());
        let mut raw = RawItem {
            item_type: field(GraphField::Type)?,
            role: field(GraphField::Role)?,
            id: field(GraphField::Id)?,
            call_id: field(GraphField::CallId)?,
            status: field(GraphField::Status)?,
            execution: field(GraphField::Execution)?,
            approval_request_id: field(GraphField::ApprovalRequestId)?,
            ..RawItem::default()
        };
        if let Some(c) = self.get(GraphField::Caller).filter(|c| !c.is_null()) {
            let Some(map) = c.mapping("caller")? else {
                let message = format!("must be a mapping, got {}", c.type_name());
                return Err(ItemError::new("caller", message).into());
            };
            let entry = |key: &str, name: &str| -> Result<Option<String>, V::Error> {
                opt_string(V::entry(&map, key, name)?.as_ref(), name)
            };
            raw.caller = Some(RawCaller {
                caller_type: entry("type", "caller.type")?,
                caller_id: entry("caller_id", "caller.caller_id")?,
            });
        }
        raw.has_encrypted_content = self
            .get(GraphField::EncryptedContent)
            .and_then(V::text)
            .is_some_and(|t| t.is_ok_and(|t| !t.is_empty()));
        if let Some(p) = self.get(GraphField::ProviderData).filter(|p| !p.is_null()) {
            raw.has_provider_data = true;
            // Only read to recognise a wrapper: a provider_data that cannot be read is not one.
            let map = p.mapping("provider_data").ok().flatten();
            let t = map.and_then(|m| V::entry(&m, "type", "provider_data.type").ok().flatten());
            raw.provider_data_type = t
                .as_ref()
                .and_then(V::text)
                .and_then(Result::ok)
                .map(str::to_string);
        }
        raw.has_tool_calls = self
            .get(GraphField::ToolCalls)
            .is_some_and(|v| !v.is_null());
        raw.has_tool_call_id = self.get(GraphField::ToolCallId).is_some();
        Ok(raw)
    }
}

impl<'a> ItemValue for &'a Value {
    type Error = ItemError;
    type Map = &'a Map<String, Value>;

    fn is_null(&self) -> bool {
        Value::is_null(self)
    }

    fn text(&self) -> Option<Result<&str, NotText>> {
        self.as_str().map(Ok)
    }

    fn type_name(&self) -> String {
        json_type_name(self).to_string()
    }

    fn mapping(&self, _field: &str) -> Result<Option<Self::Map>, ItemError> {
        Ok(self.as_object())
    }

    fn entry(map: &Self::Map, key: &str, _field: &str) -> Result<Option<Self>, ItemError> {
        Ok(map.get(key))
    }
}

impl ItemError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> ItemError {
        ItemError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl RawItem {
    /// Extract the graph-relevant fields of one JSON item (see the type docs for the error
    /// cases; a non-object item is field `item`).
    pub fn from_json(v: &Value) -> Result<RawItem, ItemError> {
        let Value::Object(obj) = v else {
            let message = format!("expected a JSON object, got {}", json_type_name(v));
            return Err(ItemError::new("item", message));
        };
        let mut fields = ItemFields::default();
        for (key, value) in obj {
            if let Some(f) = GraphField::from_name(key) {
                fields.set(f, value);
            }
        }
        fields.read()
    }
}

/// A call type that has a matching output type: the SDK's eight pairs plus the hosted MCP
/// approval request/response pair (docs/item-graph.md §1.3).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum CallType {
    FunctionCall,
    CustomToolCall,
    ComputerCall,
    LocalShellCall,
    ShellCall,
    ApplyPatchCall,
    ToolSearchCall,
    Program,
    McpApprovalRequest,
}

impl CallType {
    pub const ALL: [CallType; 9] = [
        CallType::FunctionCall,
        CallType::CustomToolCall,
        CallType::ComputerCall,
        CallType::LocalShellCall,
        CallType::ShellCall,
        CallType::ApplyPatchCall,
        CallType::ToolSearchCall,
        CallType::Program,
        CallType::McpApprovalRequest,
    ];

    /// The wire `type` of the call item.
    pub fn call_type_name(self) -> &'static str {
        match self {
            CallType::FunctionCall => "function_call",
            CallType::CustomToolCall => "custom_tool_call",
            CallType::ComputerCall => "computer_call",
            CallType::LocalShellCall => "local_shell_call",
            CallType::ShellCall => "shell_call",
            CallType::ApplyPatchCall => "apply_patch_call",
            CallType::ToolSearchCall => "tool_search_call",
            CallType::Program => "program",
            CallType::McpApprovalRequest => "mcp_approval_request",
        }
    }

    /// The wire `type` of the output item that answers this call.
    pub fn output_type_name(self) -> &'static str {
        match self {
            CallType::FunctionCall => "function_call_output",
            CallType::CustomToolCall => "custom_tool_call_output",
            CallType::ComputerCall => "computer_call_output",
            CallType::LocalShellCall => "local_shell_call_output",
            CallType::ShellCall => "shell_call_output",
            CallType::ApplyPatchCall => "apply_patch_call_output",
            CallType::ToolSearchCall => "tool_search_output",
            CallType::Program => "program_output",
            CallType::McpApprovalRequest => "mcp_approval_response",
        }
    }

    pub fn from_call_type(t: &str) -> Option<CallType> {
        CallType::ALL.into_iter().find(|c| c.call_type_name() == t)
    }

    pub fn from_output_type(t: &str) -> Option<CallType> {
        CallType::ALL
            .into_iter()
            .find(|c| c.output_type_name() == t)
    }

    /// In the SDK's `_TOOL_CALL_TO_OUTPUT_TYPE` map (everything except MCP approvals).
    pub fn is_sdk_mapped(self) -> bool {
        self != CallType::McpApprovalRequest
    }

    /// Outputs of this type may be streamed in several chunks (docs/item-graph.md §3).
    pub fn is_streamed(self) -> bool {
        matches!(self, CallType::ShellCall | CallType::ToolSearchCall)
    }
}

/// Hosted (server-executed) call types of docs/item-graph.md §1.4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum HostedKind {
    WebSearchCall,
    FileSearchCall,
    CodeInterpreterCall,
    ImageGenerationCall,
    McpCall,
    McpListTools,
}

impl HostedKind {
    pub fn type_name(self) -> &'static str {
        match self {
            HostedKind::WebSearchCall => "web_search_call",
            HostedKind::FileSearchCall => "file_search_call",
            HostedKind::CodeInterpreterCall => "code_interpreter_call",
            HostedKind::ImageGenerationCall => "image_generation_call",
            HostedKind::McpCall => "mcp_call",
            HostedKind::McpListTools => "mcp_list_tools",
        }
    }

    fn from_type(t: &str) -> Option<HostedKind> {
        Some(match t {
            "web_search_call" => HostedKind::WebSearchCall,
            "file_search_call" => HostedKind::FileSearchCall,
            "code_interpreter_call" => HostedKind::CodeInterpreterCall,
            "image_generation_call" => HostedKind::ImageGenerationCall,
            "mcp_call" => HostedKind::McpCall,
            "mcp_list_tools" => HostedKind::McpListTools,
            _ => return None,
        })
    }
}

/// Standalone items that are neither model-emitted nor controls (docs/item-graph.md §1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum StandaloneKind {
    Compaction,
    AdditionalTools,
    ConfigurationUpdate,
}

/// Input-only controls (docs/item-graph.md §1.6, §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ControlKind {
    CompactionTrigger,
    /// `{"type":"item_reference","id":…}` or an object with `id` but neither `type` nor `role`.
    ItemReference,
}

/// Why an item is foreign (never valid Responses input, docs/item-graph.md §1.7, §8, §12.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ForeignKind {
    /// The SDK-internal `hosted_tool_call` wrapper.
    HostedToolCall,
    /// Chat Completions assistant message with `tool_calls`.
    ChatToolCalls,
    /// Chat Completions `role:"tool"` message.
    ChatToolMessage,
    /// `tool_search_call` with `execution:"client"` but no string `call_id`.
    ClientAnonToolSearchCall,
    /// `tool_search_output` with `execution:"client"` but no string `call_id`.
    ClientAnonToolSearchOutput,
    /// A message whose `role` is missing or not user/system/developer/assistant/tool.
    UnknownRole,
    /// A `type` this crate does not know.
    UnknownType,
    /// Neither `type` nor `role` nor `id`.
    Untyped,
}

/// Classification of one item (docs/item-graph.md §12.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ItemKind {
    /// `role:"user"` message (easy or typed input message).
    UserMessage,
    SystemMessage,
    DeveloperMessage,
    /// User-constructed assistant message (easy-input form, no usable `id`/`status`,
    /// or the `__fake_id__` placeholder). Not a legal reasoning follower.
    AssistantInputMessage,
    /// Model-emitted assistant message (§1.1): `type:"message"`, `id` (not `__fake_id__`),
    /// status in_progress/completed/incomplete.
    AssistantMessage,
    Reasoning,
    /// A call with identity (`call_id`; `id` for `mcp_approval_request`).
    Call(CallType),
    /// An output answering a call of the given type (`mcp_approval_response` for
    /// `CallType::McpApprovalRequest`).
    Output(CallType),
    /// `tool_search_call` without a string `call_id` (server-executed).
    AnonToolSearchCall,
    /// `tool_search_output` without a string `call_id` (server-executed).
    AnonToolSearchOutput,
    Hosted(HostedKind),
    Standalone(StandaloneKind),
    Control(ControlKind),
    Foreign(ForeignKind),
}

/// One classified item: its [`ItemKind`] plus the raw fields the graph needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemMeta {
    pub kind: ItemKind,
    pub raw: RawItem,
}

const MODEL_MESSAGE_STATUSES: [&str; 3] = ["in_progress", "completed", "incomplete"];

fn classify_message(raw: &RawItem, role: Option<&str>) -> ItemKind {
    match role {
        Some("user") => ItemKind::UserMessage,
        Some("system") => ItemKind::SystemMessage,
        Some("developer") => ItemKind::DeveloperMessage,
        Some("assistant") => {
            if raw.has_tool_calls {
                ItemKind::Foreign(ForeignKind::ChatToolCalls)
            } else if raw.item_type.as_deref() == Some("message")
                && raw
                    .id
                    .as_deref()
                    .is_some_and(|id| !id.is_empty() && id != FAKE_ID)
                && raw
                    .status
                    .as_deref()
                    .is_some_and(|s| MODEL_MESSAGE_STATUSES.contains(&s))
            {
                ItemKind::AssistantMessage
            } else {
                ItemKind::AssistantInputMessage
            }
        }
        Some("tool") => ItemKind::Foreign(ForeignKind::ChatToolMessage),
        _ => ItemKind::Foreign(ForeignKind::UnknownRole),
    }
}

fn classify_kind(raw: &RawItem) -> ItemKind {
    let Some(t) = raw.item_type.as_deref() else {
        return if raw.role.is_some() {
            classify_message(raw, raw.role.as_deref())
        } else if raw.id.is_some() {
            ItemKind::Control(ControlKind::ItemReference)
        } else {
            ItemKind::Foreign(ForeignKind::Untyped)
        };
    };
    let client = raw.execution.as_deref() == Some("client");
    if t == "message" {
        return classify_message(raw, raw.role.as_deref());
    }
    if let Some(ct) = CallType::from_call_type(t) {
        if ct == CallType::ToolSearchCall && raw.call_id.is_none() {
            return if client {
                ItemKind::Foreign(ForeignKind::ClientAnonToolSearchCall)
            } else {
                ItemKind::AnonToolSearchCall
            };
        }
        return ItemKind::Call(ct);
    }
    if let Some(ct) = CallType::from_output_type(t) {
        if ct == CallType::ToolSearchCall && raw.call_id.is_none() {
            return if client {
                ItemKind::Foreign(ForeignKind::ClientAnonToolSearchOutput)
            } else {
                ItemKind::AnonToolSearchOutput
            };
        }
        return ItemKind::Output(ct);
    }
    if let Some(h) = HostedKind::from_type(t) {
        return ItemKind::Hosted(h);
    }
    match t {
        "reasoning" => ItemKind::Reasoning,
        "compaction" => ItemKind::Standalone(StandaloneKind::Compaction),
        "additional_tools" => ItemKind::Standalone(StandaloneKind::AdditionalTools),
        "configuration_update" => ItemKind::Standalone(StandaloneKind::ConfigurationUpdate),
        "compaction_trigger" => ItemKind::Control(ControlKind::CompactionTrigger),
        "item_reference" => ItemKind::Control(ControlKind::ItemReference),
        "hosted_tool_call" => ItemKind::Foreign(ForeignKind::HostedToolCall),
        _ => ItemKind::Foreign(ForeignKind::UnknownType),
    }
}

/// Classify one extracted item (docs/item-graph.md §12.1).
pub fn classify(raw: &RawItem) -> ItemMeta {
    ItemMeta::new(raw.clone())
}

impl ItemMeta {
    /// Classify an owned [`RawItem`] (no clone).
    pub fn new(raw: RawItem) -> ItemMeta {
        ItemMeta {
            kind: classify_kind(&raw),
            raw,
        }
    }

    /// Extract and classify one JSON item.
    pub fn from_json(v: &Value) -> Result<ItemMeta, ItemError> {
        RawItem::from_json(v).map(ItemMeta::new)
    }

    /// `role == "user"` message (easy or typed).
    pub fn is_user_message(&self) -> bool {
        self.kind == ItemKind::UserMessage
    }

    /// Any message with a known role (user/system/developer/assistant, either form).
    pub fn is_message(&self) -> bool {
        matches!(
            self.kind,
            ItemKind::UserMessage
                | ItemKind::SystemMessage
                | ItemKind::DeveloperMessage
                | ItemKind::AssistantInputMessage
                | ItemKind::AssistantMessage
        )
    }

    /// Input-only control (`compaction_trigger`, `item_reference`).
    pub fn is_control(&self) -> bool {
        matches!(self.kind, ItemKind::Control(_))
    }

    pub fn is_reasoning(&self) -> bool {
        self.kind == ItemKind::Reasoning
    }

    /// A Chat Completions provider's reasoning (docs/item-graph.md §6.3): the SDK's
    /// `__fake_id__` placeholder or `provider_data` (Claude's thinking through LiteLLM,
    /// DeepSeek's reasoning content). `OpenAIResponsesModel` never sends it (it removes
    /// reasoning items with `provider_data`); the Chat Completions converter sends it with the
    /// assistant message after it, which may then carry the placeholder id too.
    pub fn is_chat_reasoning(&self) -> bool {
        self.is_reasoning()
            && (self.raw.has_provider_data || self.raw.id.as_deref() == Some(FAKE_ID))
    }

    /// An assistant message a Chat Completions model produced: `type:"message"` with the
    /// SDK's `__fake_id__` placeholder. A legal follower of [`Self::is_chat_reasoning`] only.
    pub fn is_chat_model_message(&self) -> bool {
        self.kind == ItemKind::AssistantInputMessage
            && self.raw.item_type.as_deref() == Some("message")
            && self.raw.id.as_deref() == Some(FAKE_ID)
    }

    pub fn is_foreign(&self) -> bool {
        matches!(self.kind, ItemKind::Foreign(_))
    }

    /// Legal reasoning follower (§6.3): model-emitted assistant message, any call with or
    /// without identity (incl. `program`, `mcp_approval_request`, anonymous tool search),
    /// hosted calls.
    pub fn is_model_emitted(&self) -> bool {
        matches!(
            self.kind,
            ItemKind::AssistantMessage
                | ItemKind::Call(_)
                | ItemKind::AnonToolSearchCall
                | ItemKind::Hosted(_)
        )
    }

    /// Server-emitted output (§6.3): `program_output`, non-client `tool_search_output`.
    pub fn is_server_output(&self) -> bool {
        match self.kind {
            ItemKind::Output(CallType::Program) | ItemKind::AnonToolSearchOutput => true,
            ItemKind::Output(CallType::ToolSearchCall) => {
                self.raw.execution.as_deref() != Some("client")
            }
            _ => false,
        }
    }

    /// Anything that answers a call: client or server outputs, `mcp_approval_response`,
    /// anonymous / client tool search outputs, Chat Completions `role:"tool"` messages.
    pub fn is_output(&self) -> bool {
        matches!(
            self.kind,
            ItemKind::Output(_)
                | ItemKind::AnonToolSearchOutput
                | ItemKind::Foreign(ForeignKind::ClientAnonToolSearchOutput)
                | ItemKind::Foreign(ForeignKind::ChatToolMessage)
        )
    }

    /// A call of a paired type (with identity field, possibly empty): its call type.
    pub fn call_type(&self) -> Option<CallType> {
        match self.kind {
            ItemKind::Call(ct) => Some(ct),
            _ => None,
        }
    }

    /// An output of a paired type: the call type it answers.
    pub fn output_of(&self) -> Option<CallType> {
        match self.kind {
            ItemKind::Output(ct) => Some(ct),
            _ => None,
        }
    }

    /// Pairing identity of a CALL/OUT item (§12.1), possibly empty: `call_id`; `id` for
    /// `mcp_approval_request`; `approval_request_id` for `mcp_approval_response`;
    /// `call_id`, else `id`, for `local_shell_call_output`. `None` for other kinds.
    pub fn identity(&self) -> Option<&str> {
        let r = &self.raw;
        match self.kind {
            ItemKind::Call(CallType::McpApprovalRequest) => r.id.as_deref(),
            ItemKind::Call(_) => r.call_id.as_deref(),
            ItemKind::Output(CallType::McpApprovalRequest) => r.approval_request_id.as_deref(),
            ItemKind::Output(CallType::LocalShellCall) => r.call_id.as_deref().or(r.id.as_deref()),
            ItemKind::Output(_) => r.call_id.as_deref(),
            _ => None,
        }
    }

    /// `local_shell_call_output` identified through the schema's `id` (no `call_id`).
    pub fn uses_id_fallback(&self) -> bool {
        self.kind == ItemKind::Output(CallType::LocalShellCall)
            && self.raw.call_id.is_none()
            && self.raw.id.is_some()
    }

    /// Whether the item carries a non-null `caller` object.
    pub fn has_caller(&self) -> bool {
        self.raw.caller.is_some()
    }

    /// `caller.type == "program"`.
    pub fn is_program_owned(&self) -> bool {
        self.raw
            .caller
            .as_ref()
            .is_some_and(|c| c.caller_type.as_deref() == Some("program"))
    }

    /// `caller.caller_id` of a program-owned item (None if not program-owned or id missing).
    pub fn program_caller(&self) -> Option<&str> {
        match &self.raw.caller {
            Some(c) if c.caller_type.as_deref() == Some("program") => c.caller_id.as_deref(),
            _ => None,
        }
    }

    /// The SDK de-duplication key (§9.5): `(type, value)`, or `None` when the SDK never
    /// collapses the item (it has a `role`, is a `message`, or has no usable field).
    pub fn dedup_key(&self) -> Option<(Option<&str>, &str)> {
        let r = &self.raw;
        let t = r.item_type.as_deref();
        if r.role.is_some() || t == Some("message") {
            return None;
        }
        let mapped = t.is_some_and(|t| {
            CallType::from_call_type(t).is_some_and(CallType::is_sdk_mapped)
                || CallType::from_output_type(t).is_some_and(CallType::is_sdk_mapped)
        });
        if mapped {
            if let Some(c) = r.call_id.as_deref() {
                return Some((t, c));
            }
        }
        if let Some(id) = r.id.as_deref().filter(|id| *id != FAKE_ID) {
            return Some((t, id));
        }
        if let Some(c) = r.call_id.as_deref() {
            return Some((t, c));
        }
        r.approval_request_id.as_deref().map(|a| (t, a))
    }

    /// Short snake_case name for reports (that of its [`ItemKind`]).
    pub fn kind_name(&self) -> &'static str {
        self.kind.name()
    }
}

impl ItemKind {
    /// Every kind the classifier gives (for tests that must meet each one).
    pub fn all() -> Vec<ItemKind> {
        let mut out = vec![
            ItemKind::UserMessage,
            ItemKind::SystemMessage,
            ItemKind::DeveloperMessage,
            ItemKind::AssistantInputMessage,
            ItemKind::AssistantMessage,
            ItemKind::Reasoning,
            ItemKind::AnonToolSearchCall,
            ItemKind::AnonToolSearchOutput,
        ];
        for ct in CallType::ALL {
            out.push(ItemKind::Call(ct));
            out.push(ItemKind::Output(ct));
        }
        out.extend(
            [
                HostedKind::WebSearchCall,
                HostedKind::FileSearchCall,
                HostedKind::CodeInterpreterCall,
                HostedKind::ImageGenerationCall,
                HostedKind::McpCall,
                HostedKind::McpListTools,
            ]
            .map(ItemKind::Hosted),
        );
        out.extend(
            [
                StandaloneKind::Compaction,
                StandaloneKind::AdditionalTools,
                StandaloneKind::ConfigurationUpdate,
            ]
            .map(ItemKind::Standalone),
        );
        out.extend(
            [ControlKind::CompactionTrigger, ControlKind::ItemReference].map(ItemKind::Control),
        );
        out.extend(
            [
                ForeignKind::HostedToolCall,
                ForeignKind::ChatToolCalls,
                ForeignKind::ChatToolMessage,
                ForeignKind::ClientAnonToolSearchCall,
                ForeignKind::ClientAnonToolSearchOutput,
                ForeignKind::UnknownRole,
                ForeignKind::UnknownType,
                ForeignKind::Untyped,
            ]
            .map(ItemKind::Foreign),
        );
        out
    }

    /// Short snake_case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            ItemKind::UserMessage => "user_message",
            ItemKind::SystemMessage => "system_message",
            ItemKind::DeveloperMessage => "developer_message",
            ItemKind::AssistantInputMessage => "assistant_input_message",
            ItemKind::AssistantMessage => "assistant_message",
            ItemKind::Reasoning => "reasoning",
            ItemKind::Call(ct) => ct.call_type_name(),
            ItemKind::Output(ct) => ct.output_type_name(),
            ItemKind::AnonToolSearchCall => "anonymous_tool_search_call",
            ItemKind::AnonToolSearchOutput => "anonymous_tool_search_output",
            ItemKind::Hosted(h) => h.type_name(),
            ItemKind::Standalone(StandaloneKind::Compaction) => "compaction",
            ItemKind::Standalone(StandaloneKind::AdditionalTools) => "additional_tools",
            ItemKind::Standalone(StandaloneKind::ConfigurationUpdate) => "configuration_update",
            ItemKind::Control(ControlKind::CompactionTrigger) => "compaction_trigger",
            ItemKind::Control(ControlKind::ItemReference) => "item_reference",
            ItemKind::Foreign(f) => match f {
                ForeignKind::HostedToolCall => "hosted_tool_call",
                ForeignKind::ChatToolCalls => "chat_tool_calls",
                ForeignKind::ChatToolMessage => "chat_tool_message",
                ForeignKind::ClientAnonToolSearchCall => "client_tool_search_call_without_call_id",
                ForeignKind::ClientAnonToolSearchOutput => {
                    "client_tool_search_output_without_call_id"
                }
                ForeignKind::UnknownRole => "unknown_role",
                ForeignKind::UnknownType => "unknown_type",
                ForeignKind::Untyped => "untyped",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: Value) -> ItemMeta {
        match ItemMeta::from_json(&v) {
            Ok(m) => m,
            Err(e) => panic!("unexpected error {e} for {v}"),
        }
    }

    fn kind(v: Value) -> ItemKind {
        meta(v).kind
    }

    #[test]
    fn messages() {
        assert_eq!(
            kind(json!({"role":"user","content":"hi"})),
            ItemKind::UserMessage
        );
        assert_eq!(
            kind(json!({"type":"message","role":"developer","content":[]})),
            ItemKind::DeveloperMessage
        );
        assert_eq!(
            kind(json!({"role":"assistant","content":"x"})),
            ItemKind::AssistantInputMessage
        );
        let model = json!({"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[]});
        assert_eq!(kind(model), ItemKind::AssistantMessage);
        assert!(meta(
            json!({"type":"message","role":"assistant","id":"msg_1","status":"incomplete"})
        )
        .is_model_emitted());
        // The Chat Completions placeholder id is not model-emitted.
        assert_eq!(
            kind(
                json!({"type":"message","role":"assistant","id":"__fake_id__","status":"completed"})
            ),
            ItemKind::AssistantInputMessage
        );
        // Without explicit type:"message", or without a valid status: user-constructed.
        assert_eq!(
            kind(json!({"role":"assistant","id":"msg_1","status":"completed"})),
            ItemKind::AssistantInputMessage
        );
        assert_eq!(
            kind(json!({"type":"message","role":"assistant","id":"msg_1","status":"done"})),
            ItemKind::AssistantInputMessage
        );
        assert_eq!(
            kind(json!({"type":"message","role":"critic","content":"x"})),
            ItemKind::Foreign(ForeignKind::UnknownRole)
        );
        assert_eq!(
            kind(json!({"type":"message","content":"x"})),
            ItemKind::Foreign(ForeignKind::UnknownRole)
        );
        assert!(meta(json!({"role":"user","content":"x"})).is_user_message());
        assert!(meta(json!({"type":"message","role":"user","content":[]})).is_user_message());
    }

    #[test]
    fn chat_completions_shapes_are_foreign() {
        let a = meta(json!({"role":"assistant","content":null,"tool_calls":[]}));
        assert_eq!(a.kind, ItemKind::Foreign(ForeignKind::ChatToolCalls));
        let t = meta(json!({"role":"tool","tool_call_id":"c1","content":"ok"}));
        assert_eq!(t.kind, ItemKind::Foreign(ForeignKind::ChatToolMessage));
        assert!(t.is_output());
        assert!(t.raw.has_tool_call_id);
        // tool_calls: null is not the Chat Completions shape.
        assert_eq!(
            kind(json!({"role":"assistant","content":"x","tool_calls":null})),
            ItemKind::AssistantInputMessage
        );
    }

    #[test]
    fn calls_outputs_and_identity() {
        let c = meta(json!({"type":"function_call","call_id":"c1","id":"fc_1"}));
        assert_eq!(c.kind, ItemKind::Call(CallType::FunctionCall));
        assert_eq!(c.identity(), Some("c1"));
        assert!(c.is_model_emitted());
        let o = meta(json!({"type":"function_call_output","call_id":"c1"}));
        assert_eq!(o.kind, ItemKind::Output(CallType::FunctionCall));
        assert!(o.is_output() && !o.is_model_emitted());
        let r = meta(json!({"type":"mcp_approval_request","id":"mcpr_1"}));
        assert_eq!(r.identity(), Some("mcpr_1"));
        let a = meta(json!({"type":"mcp_approval_response","approval_request_id":"mcpr_1"}));
        assert_eq!(a.kind, ItemKind::Output(CallType::McpApprovalRequest));
        assert_eq!(a.identity(), Some("mcpr_1"));
        let ls = meta(json!({"type":"local_shell_call_output","id":"c1"}));
        assert_eq!(ls.identity(), Some("c1"));
        assert!(ls.uses_id_fallback());
        let ls2 = meta(json!({"type":"local_shell_call_output","id":"x","call_id":"c1"}));
        assert_eq!(ls2.identity(), Some("c1"));
        assert!(!ls2.uses_id_fallback());
        let po = meta(json!({"type":"program_output","call_id":"p1","id":"po_1"}));
        assert!(po.is_server_output());
        assert_eq!(po.kind_name(), "program_output");
    }

    #[test]
    fn tool_search_variants() {
        assert_eq!(
            kind(json!({"type":"tool_search_call","id":"ts1"})),
            ItemKind::AnonToolSearchCall
        );
        assert_eq!(
            kind(json!({"type":"tool_search_output","id":"t","execution":"server"})),
            ItemKind::AnonToolSearchOutput
        );
        assert_eq!(
            kind(json!({"type":"tool_search_call","id":"ts1","execution":"client"})),
            ItemKind::Foreign(ForeignKind::ClientAnonToolSearchCall)
        );
        assert_eq!(
            kind(json!({"type":"tool_search_output","execution":"client"})),
            ItemKind::Foreign(ForeignKind::ClientAnonToolSearchOutput)
        );
        let c = meta(json!({"type":"tool_search_call","call_id":"t1","execution":"client"}));
        assert_eq!(c.kind, ItemKind::Call(CallType::ToolSearchCall));
        let o = meta(json!({"type":"tool_search_output","call_id":"t1","execution":"client"}));
        assert!(!o.is_server_output());
        let o = meta(json!({"type":"tool_search_output","call_id":"t1"}));
        assert!(o.is_server_output());
        assert!(meta(json!({"type":"tool_search_output"})).is_server_output());
    }

    #[test]
    fn hosted_standalone_control_foreign() {
        let w = meta(json!({"type":"web_search_call","id":"ws_1"}));
        assert_eq!(w.kind, ItemKind::Hosted(HostedKind::WebSearchCall));
        assert!(w.is_model_emitted());
        assert_eq!(
            kind(json!({"type":"compaction","encrypted_content":"x"})),
            ItemKind::Standalone(StandaloneKind::Compaction)
        );
        assert_eq!(
            kind(json!({"type":"additional_tools","role":"developer","tools":[]})),
            ItemKind::Standalone(StandaloneKind::AdditionalTools)
        );
        assert!(meta(json!({"type":"compaction_trigger"})).is_control());
        assert_eq!(
            kind(json!({"id":"msg_0"})),
            ItemKind::Control(ControlKind::ItemReference)
        );
        assert_eq!(
            kind(json!({"type":"item_reference","id":"msg_0"})),
            ItemKind::Control(ControlKind::ItemReference)
        );
        let h = meta(
            json!({"type":"hosted_tool_call","provider_data":{"type":"mcp_approval_request","id":"m"}}),
        );
        assert_eq!(h.kind, ItemKind::Foreign(ForeignKind::HostedToolCall));
        assert_eq!(
            h.raw.provider_data_type.as_deref(),
            Some("mcp_approval_request")
        );
        assert!(h.raw.has_provider_data);
        assert_eq!(
            kind(json!({"type":"telepathy"})),
            ItemKind::Foreign(ForeignKind::UnknownType)
        );
        assert_eq!(
            kind(json!({"content":"x"})),
            ItemKind::Foreign(ForeignKind::Untyped)
        );
        assert_eq!(kind(json!({})), ItemKind::Foreign(ForeignKind::Untyped));
    }

    #[test]
    fn raw_fields() {
        let m =
            meta(json!({"type":"reasoning","id":"rs","encrypted_content":"","provider_data":null}));
        assert!(!m.raw.has_encrypted_content);
        assert!(!m.raw.has_provider_data);
        let m = meta(json!({"type":"reasoning","encrypted_content":"e","provider_data":{"x":1}}));
        assert!(m.raw.has_encrypted_content && m.raw.has_provider_data);
        assert_eq!(m.raw.provider_data_type, None);
        let m = meta(
            json!({"type":"function_call","call_id":"c","caller":{"type":"program","caller_id":"p1"}}),
        );
        assert_eq!(m.program_caller(), Some("p1"));
        assert!(m.is_program_owned());
        let m = meta(json!({"type":"function_call","call_id":"c","caller":{"type":"direct"}}));
        assert!(m.has_caller() && !m.is_program_owned());
        assert_eq!(m.program_caller(), None);
        let m = meta(json!({"type":"function_call","call_id":null,"id":null,"caller":null}));
        assert_eq!(m.raw.call_id, None);
        assert!(!m.has_caller());
    }

    #[test]
    fn extraction_errors() {
        let e = RawItem::from_json(&json!([1])).unwrap_err();
        assert_eq!(e.field, "item");
        let e = RawItem::from_json(&json!({"type":"function_call","call_id":7})).unwrap_err();
        assert_eq!(e.field, "call_id");
        assert!(e.to_string().starts_with("call_id: "));
        let e = RawItem::from_json(&json!({"id":{"a":1}})).unwrap_err();
        assert_eq!(e.field, "id");
        let e = RawItem::from_json(&json!({"type":"x","caller":"program"})).unwrap_err();
        assert_eq!(e.field, "caller");
        let e = RawItem::from_json(&json!({"type":"x","caller":{"type":"program","caller_id":1}}))
            .unwrap_err();
        assert_eq!(e.field, "caller.caller_id");
        let e = RawItem::from_json(&json!({"type":"x","caller":{"type":false}})).unwrap_err();
        assert_eq!(e.field, "caller.type");
        for f in ["type", "role", "status", "execution", "approval_request_id"] {
            let mut v = json!({});
            v[f] = json!(1.5);
            assert_eq!(RawItem::from_json(&v).unwrap_err().field, f);
        }
    }

    #[test]
    fn every_kind_is_listed_once() {
        let all = ItemKind::all();
        let names: std::collections::HashSet<_> = all.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), all.len());
        assert_eq!(all.len(), 45);
    }

    #[test]
    fn dedup_keys() {
        let k = |v: Value| {
            let m = meta(v);
            m.dedup_key()
                .map(|(t, s)| (t.map(str::to_string), s.to_string()))
        };
        let s = |t: &str, v: &str| Some((Some(t.to_string()), v.to_string()));
        assert_eq!(k(json!({"role":"user","content":"x"})), None);
        assert_eq!(k(json!({"type":"message","id":"m"})), None);
        assert_eq!(
            k(json!({"type":"function_call","call_id":"c","id":"fc"})),
            s("function_call", "c")
        );
        assert_eq!(
            k(json!({"type":"reasoning","id":"rs"})),
            s("reasoning", "rs")
        );
        assert_eq!(k(json!({"type":"reasoning"})), None);
        assert_eq!(
            k(json!({"type":"mcp_approval_request","id":"m","call_id":"x"})),
            s("mcp_approval_request", "m")
        );
        assert_eq!(
            k(json!({"type":"mcp_call","id":"__fake_id__","call_id":"x"})),
            s("mcp_call", "x")
        );
        assert_eq!(
            k(json!({"type":"mcp_approval_response","approval_request_id":"m"})),
            s("mcp_approval_response", "m")
        );
        assert_eq!(k(json!({"id":"msg_0"})), Some((None, "msg_0".to_string())));
    }
}
