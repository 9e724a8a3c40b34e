//! A random generator of histories made of every item shape docs/item-graph.md lists, in the
//! forms the Agents SDK stores them (streamed shell and anonymous-search outputs, program
//! children, approval chains, id-less reasoning, Chat Completions placeholders ...), plus the
//! broken forms the rules exist for, for the property tests of the incremental index.
//!
//! [`Shape::ALL`] is the catalogue; `every_shape_is_generated` (in each test file that uses
//! it) checks that a few hundred cases draw every one of them, and that the kinds they hold
//! cover every kind of the core's classifier. [`Case::draw`] splits one sequence of shapes
//! into the indexed history, the items appended since and the new input at any position, so
//! that any shape lands in any region: wholly in history, across the history/new-input
//! boundary, inside an appended block, or across the end of what the index holds.

#![allow(dead_code)] // each test file uses part of it

use protoprompt_core::items::ItemMeta;
use serde_json::{json, Value};

/// xorshift64*: a small deterministic generator (the seeds are the test cases).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// One shape of docs/item-graph.md (§1 catalogue, §3 streams, §4 programs, §5 anonymous
/// search, §6 reasoning, §7 controls, §8 foreign shapes), as a short run of items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    // §1.1 messages
    UserEasy,
    UserInputMessage,
    SystemMessage,
    DeveloperMessage,
    AssistantEasy,
    AssistantModel,
    // §1.2, §6 reasoning
    ReasoningAnswer,
    IdlessReasoningCall,
    ReasoningChain,
    // §1.3 call/output pairs
    FunctionPair,
    ParallelCalls,
    CustomPair,
    ComputerPair,
    LocalShellPair,
    ShellStreamStatusless,
    ShellStreamStatuses,
    ApplyPatchPair,
    ClientToolSearchPair,
    // §5 anonymous server tool search
    AnonSearch,
    AnonSearchStreamed,
    // §4 programs
    ProgramWithChildren,
    ProgramHostedChildren,
    ProgramIncomplete,
    // §1.4, §1.5 hosted and MCP
    HostedCalls,
    McpApprovalChain,
    McpRejected,
    // §1.4 standalone
    Compaction,
    AdditionalTools,
    ConfigurationUpdate,
    // §1.8 Chat Completions-backed models: the `__fake_id__` placeholder
    PlaceholderTurn,
    // broken forms (§2.2, §3, §4.4, §5, §6.3, §7, §8, §9.5)
    CallWithoutOutput,
    OrphanOutput,
    OutputBeforeCall,
    MismatchedOutput,
    BadStream,
    AnonTwoCallsOneOutput,
    AnonOutputAlone,
    ClientAnonSearch,
    ProgramWithoutOutput,
    DanglingReasoning,
    DuplicateReasoningId,
    DuplicateHostedId,
    LocalShellIdOnly,
    McpUnanswered,
    Controls,
    ChatShapes,
    HostedWrapper,
    UnknownShapes,
}

impl Shape {
    pub const ALL: [Shape; 48] = [
        Shape::UserEasy,
        Shape::UserInputMessage,
        Shape::SystemMessage,
        Shape::DeveloperMessage,
        Shape::AssistantEasy,
        Shape::AssistantModel,
        Shape::ReasoningAnswer,
        Shape::IdlessReasoningCall,
        Shape::ReasoningChain,
        Shape::FunctionPair,
        Shape::ParallelCalls,
        Shape::CustomPair,
        Shape::ComputerPair,
        Shape::LocalShellPair,
        Shape::ShellStreamStatusless,
        Shape::ShellStreamStatuses,
        Shape::ApplyPatchPair,
        Shape::ClientToolSearchPair,
        Shape::AnonSearch,
        Shape::AnonSearchStreamed,
        Shape::ProgramWithChildren,
        Shape::ProgramHostedChildren,
        Shape::ProgramIncomplete,
        Shape::HostedCalls,
        Shape::McpApprovalChain,
        Shape::McpRejected,
        Shape::Compaction,
        Shape::AdditionalTools,
        Shape::ConfigurationUpdate,
        Shape::PlaceholderTurn,
        Shape::CallWithoutOutput,
        Shape::OrphanOutput,
        Shape::OutputBeforeCall,
        Shape::MismatchedOutput,
        Shape::BadStream,
        Shape::AnonTwoCallsOneOutput,
        Shape::AnonOutputAlone,
        Shape::ClientAnonSearch,
        Shape::ProgramWithoutOutput,
        Shape::DanglingReasoning,
        Shape::DuplicateReasoningId,
        Shape::DuplicateHostedId,
        Shape::LocalShellIdOnly,
        Shape::McpUnanswered,
        Shape::Controls,
        Shape::ChatShapes,
        Shape::HostedWrapper,
        Shape::UnknownShapes,
    ];

    /// The first broken shape in [`Shape::ALL`]: the ones before it are valid as stored.
    pub const FIRST_BROKEN: usize = 30;

    pub fn is_valid(self) -> bool {
        Shape::ALL.iter().position(|&s| s == self).unwrap() < Shape::FIRST_BROKEN
    }
}

/// Makes the items of shapes, with ids unique to the generator (`tag` keeps two generators'
/// ids apart). Some broken shapes reuse an id made earlier, as a relation across the
/// history.
pub struct Maker {
    pub rng: Rng,
    n: usize,
    tag: &'static str,
    /// Reasoning and hosted ids made so far (for duplicates far apart).
    reasoning_ids: Vec<String>,
    hosted_ids: Vec<String>,
}

impl Maker {
    pub fn new(seed: u64, tag: &'static str) -> Maker {
        Maker {
            rng: Rng(seed | 1),
            n: 0,
            tag,
            reasoning_ids: Vec::new(),
            hosted_ids: Vec::new(),
        }
    }

    fn id(&mut self, prefix: &str) -> String {
        self.n += 1;
        format!("{prefix}{}{}", self.tag, self.n)
    }

    fn reasoning(&mut self) -> Value {
        let id = self.id("rs_");
        self.reasoning_ids.push(id.clone());
        json!({"type":"reasoning","id":id,"summary":[],"encrypted_content":"gAAA"})
    }

    fn idless_reasoning(&mut self) -> Value {
        if self.rng.chance(2) {
            json!({"type":"reasoning","summary":[{"type":"summary_text","text":"plan"}]})
        } else {
            json!({"type":"reasoning","summary":[],"encrypted_content":"gAAA"})
        }
    }

    fn maybe_reasoning(&mut self) -> Vec<Value> {
        match self.rng.below(4) {
            0 => vec![],
            1 => vec![self.idless_reasoning()],
            _ => vec![self.reasoning()],
        }
    }

    fn msg(&mut self) -> Value {
        let id = self.id("msg_");
        json!({"type":"message","role":"assistant","id":id,"status":"completed",
               "content":[{"type":"output_text","text":"ok","annotations":[]}]})
    }

    fn call(&mut self, call_type: &str, caller: Option<&str>) -> (Value, String) {
        let call_id = self.id("call_");
        let mut v = json!({"type":call_type,"call_id":call_id,"status":"completed"});
        match call_type {
            "function_call" => {
                v["name"] = json!("f");
                v["arguments"] = json!("{}");
                v["id"] = json!(self.id("fc_"));
            }
            "custom_tool_call" => {
                v["name"] = json!("grep");
                v["input"] = json!("x");
                v.as_object_mut().unwrap().remove("status");
            }
            "computer_call" => {
                v["id"] = json!(self.id("cu_"));
                v["action"] = json!({"type":"screenshot"});
                v["pending_safety_checks"] = json!([]);
            }
            "local_shell_call" => {
                v["id"] = json!(self.id("lsh_"));
                v["action"] = json!({"type":"exec","command":["ls"],"env":{}});
            }
            "shell_call" => {
                v["id"] = json!(self.id("sh_"));
                v["action"] = json!({"commands":["ls"]});
            }
            "apply_patch_call" => {
                v["operation"] = json!({"type":"delete_file","path":"x"});
            }
            _ => {}
        }
        if let Some(p) = caller {
            v["caller"] = json!({"type":"program","caller_id":p});
        }
        (v, call_id)
    }

    fn output(call_type: &str, call_id: &str, caller: Option<&str>) -> Value {
        let out_type = match call_type {
            "tool_search_call" => "tool_search_output".to_string(),
            t => format!("{t}_output"),
        };
        let mut v = json!({"type":out_type,"call_id":call_id,"output":"x"});
        if call_type == "apply_patch_call" {
            v["status"] = json!("completed");
        }
        if let Some(p) = caller {
            v["caller"] = json!({"type":"program","caller_id":p});
        }
        v
    }

    fn pair(&mut self, call_type: &str) -> Vec<Value> {
        let (call, id) = self.call(call_type, None);
        let mut out = self.maybe_reasoning();
        out.push(call);
        out.push(Self::output(call_type, &id, None));
        out
    }

    fn anon_call(&mut self) -> Value {
        let id = self.id("tsc_");
        json!({"type":"tool_search_call","id":id,"execution":"server",
               "arguments":{"query":"crm"},"status":"completed"})
    }

    fn anon_output(&mut self, status: &str) -> Value {
        let id = self.id("tso_");
        json!({"type":"tool_search_output","id":id,"execution":"server","tools":[],
               "status":status})
    }

    fn shell_chunks(&mut self, call_id: &str, statuses: bool) -> Vec<Value> {
        let k = 1 + self.rng.below(3);
        (0..k)
            .map(|i| {
                let mut v = json!({"type":"shell_call_output","call_id":call_id,
                                   "output":[{"stdout":"a","stderr":"","outcome":{"type":"exit","exit_code":0}}]});
                if statuses {
                    v["status"] = json!(if i + 1 == k {
                        "completed"
                    } else {
                        "in_progress"
                    });
                }
                v
            })
            .collect()
    }

    fn hosted(&mut self, kind: &str, caller: Option<&str>) -> Value {
        let id = self.id(match kind {
            "web_search_call" => "ws_",
            "file_search_call" => "fs_",
            "code_interpreter_call" => "ci_",
            "image_generation_call" => "ig_",
            _ => "h_",
        });
        self.hosted_ids.push(id.clone());
        let mut v = json!({"type":kind,"id":id,"status":"completed"});
        match kind {
            "web_search_call" => v["action"] = json!({"type":"search","query":"q"}),
            "file_search_call" => v["queries"] = json!(["q"]),
            "code_interpreter_call" => {
                v["code"] = json!("print(1)");
                v["container_id"] = json!("cntr_1");
                v["outputs"] = json!(null);
            }
            _ => v["result"] = json!(null),
        }
        if let Some(p) = caller {
            v["caller"] = json!({"type":"program","caller_id":p});
        }
        v
    }

    fn program(&mut self, hosted_children: bool, status: Option<&str>) -> Vec<Value> {
        let pid = self.id("prog_");
        let mut out = self.maybe_reasoning();
        out.push(
            json!({"type":"program","id":self.id("pg_"),"call_id":pid,"code":"js",
                        "fingerprint":"fp"}),
        );
        let mut outputs = Vec::new();
        for _ in 0..1 + self.rng.below(2) {
            let t = ["function_call", "custom_tool_call", "apply_patch_call"][self.rng.below(3)];
            let (call, id) = self.call(t, Some(&pid));
            out.push(call);
            outputs.push(Self::output(t, &id, Some(&pid)));
        }
        out.extend(outputs);
        if hosted_children {
            out.push(self.hosted("web_search_call", Some(&pid)));
            // A pending program-owned hosted shell call and an unanswered program-owned MCP
            // request may stay without output (V5).
            let (mut shell, _) = self.call("shell_call", Some(&pid));
            shell["status"] = json!("in_progress");
            out.push(shell);
            out.push(
                json!({"type":"mcp_approval_request","id":self.id("mcpr_"),"name":"t",
                            "server_label":"crm","arguments":"{}",
                            "caller":{"type":"program","caller_id":pid}}),
            );
        }
        if let Some(status) = status {
            out.push(
                json!({"type":"program_output","id":self.id("po_"),"call_id":pid,
                            "result":"done","status":status}),
            );
        }
        out
    }

    fn mcp(&mut self, approve: bool) -> Vec<Value> {
        let mut out = vec![json!({"type":"mcp_list_tools","id":self.id("mcpl_"),
                                  "server_label":"crm","tools":[]})];
        out.extend(self.maybe_reasoning());
        let req = self.id("mcpr_");
        out.push(
            json!({"type":"mcp_approval_request","id":req,"name":"t","server_label":"crm",
                        "arguments":"{}"}),
        );
        out.push(
            json!({"type":"mcp_approval_response","approval_request_id":req,
                        "approve":approve}),
        );
        out.extend(self.maybe_reasoning());
        out.push(
            json!({"type":"mcp_call","id":self.id("mcp_"),"name":"t","server_label":"crm",
                        "arguments":"{}","approval_request_id":req,
                        "status":if approve {"completed"} else {"failed"}}),
        );
        out
    }

    /// The items of one shape.
    pub fn make(&mut self, shape: Shape) -> Vec<Value> {
        let i = Shape::ALL.iter().position(|&s| s == shape).unwrap();
        match i {
            0..9 => self.messages(shape),
            9..20 => self.calls(shape),
            20..Shape::FIRST_BROKEN => self.hosted_and_programs(shape),
            30..38 => self.broken_pairs(shape),
            _ => self.broken_other(shape),
        }
    }

    /// Messages and reasoning
    fn messages(&mut self, shape: Shape) -> Vec<Value> {
        let text = "hi";
        match shape {
            Shape::UserEasy => vec![json!({"role":"user","content":text})],
            Shape::UserInputMessage => vec![json!({"type":"message","role":"user",
                "content":[{"type":"input_text","text":text}]})],
            Shape::SystemMessage => vec![json!({"role":"system","content":text})],
            Shape::DeveloperMessage => vec![json!({"type":"message","role":"developer",
                "content":[{"type":"input_text","text":text}]})],
            Shape::AssistantEasy => vec![json!({"role":"assistant","content":text})],
            Shape::AssistantModel => vec![self.msg()],
            Shape::ReasoningAnswer => {
                let r = self.reasoning();
                vec![r, self.msg()]
            }
            Shape::IdlessReasoningCall => {
                let (call, id) = self.call("function_call", None);
                let r1 = self.idless_reasoning();
                let r2 = self.idless_reasoning();
                vec![
                    r1,
                    call,
                    Self::output("function_call", &id, None),
                    r2,
                    self.msg(),
                ]
            }
            Shape::ReasoningChain => {
                // Two reasoning items and a hosted call before the answer: one block.
                let r1 = self.reasoning();
                let r2 = self.idless_reasoning();
                let ws = self.hosted("web_search_call", None);
                vec![r1, r2, ws, self.msg()]
            }
            _ => unreachable!("{shape:?} is not messages and reasoning"),
        }
    }

    /// Calls with their outputs
    fn calls(&mut self, shape: Shape) -> Vec<Value> {
        match shape {
            Shape::FunctionPair => self.pair("function_call"),
            Shape::ParallelCalls => {
                let mut out = self.maybe_reasoning();
                let mut outs = Vec::new();
                for _ in 0..2 + self.rng.below(2) {
                    let (call, id) = self.call("function_call", None);
                    out.push(call);
                    outs.push(Self::output("function_call", &id, None));
                }
                out.extend(outs);
                out
            }
            Shape::CustomPair => self.pair("custom_tool_call"),
            Shape::ComputerPair => self.pair("computer_call"),
            Shape::LocalShellPair => self.pair("local_shell_call"),
            Shape::ShellStreamStatusless | Shape::ShellStreamStatuses => {
                let (call, id) = self.call("shell_call", None);
                let mut out = self.maybe_reasoning();
                out.push(call);
                out.extend(self.shell_chunks(&id, shape == Shape::ShellStreamStatuses));
                out
            }
            Shape::ApplyPatchPair => self.pair("apply_patch_call"),
            Shape::ClientToolSearchPair => {
                let call_id = self.id("call_");
                let mut out = self.maybe_reasoning();
                out.push(json!({"type":"tool_search_call","id":self.id("tsc_"),
                                "call_id":call_id,"execution":"client",
                                "arguments":{"query":"crm"},"status":"completed"}));
                out.push(json!({"type":"tool_search_output","id":self.id("tso_"),
                                "call_id":call_id,"execution":"client","tools":[],
                                "status":"completed"}));
                out
            }
            Shape::AnonSearch => {
                // Search, its result and the call to a tool it found: one model response.
                let mut out = self.maybe_reasoning();
                out.push(self.anon_call());
                out.push(self.anon_output("completed"));
                out.extend(self.pair("function_call"));
                out
            }
            Shape::AnonSearchStreamed => {
                let mut out = self.maybe_reasoning();
                out.push(self.anon_call());
                for _ in 0..1 + self.rng.below(3) {
                    out.push(self.anon_output("in_progress"));
                }
                out.push(self.anon_output("completed"));
                if self.rng.chance(2) {
                    out.push(self.msg());
                }
                out
            }
            _ => unreachable!("{shape:?} is not calls with their outputs"),
        }
    }

    /// Programs, hosted and standalone items
    fn hosted_and_programs(&mut self, shape: Shape) -> Vec<Value> {
        match shape {
            Shape::ProgramWithChildren => self.program(false, Some("completed")),
            Shape::ProgramHostedChildren => self.program(true, Some("completed")),
            Shape::ProgramIncomplete => {
                let hosted = self.rng.chance(2);
                self.program(hosted, Some("incomplete"))
            }
            Shape::HostedCalls => {
                let mut out = self.maybe_reasoning();
                for kind in [
                    "web_search_call",
                    "file_search_call",
                    "code_interpreter_call",
                    "image_generation_call",
                ] {
                    if self.rng.chance(2) || kind == "web_search_call" {
                        out.push(self.hosted(kind, None));
                    }
                }
                out.push(self.msg());
                out
            }
            Shape::McpApprovalChain => self.mcp(true),
            Shape::McpRejected => self.mcp(false),
            Shape::Compaction => {
                vec![json!({"type":"compaction","id":self.id("cmp_"),"encrypted_content":"e"})]
            }
            Shape::AdditionalTools => {
                vec![json!({"type":"additional_tools","role":"developer","tools":[]})]
            }
            Shape::ConfigurationUpdate => {
                vec![json!({"type":"configuration_update","reasoning":{"effort":"low"}})]
            }
            Shape::PlaceholderTurn => {
                let fake = "__fake_id__";
                let call_id = self.id("call_");
                vec![
                    json!({"type":"reasoning","id":fake,"summary":[]}),
                    json!({"type":"function_call","id":fake,"call_id":call_id,"name":"f",
                           "arguments":"{}"}),
                    json!({"type":"function_call_output","call_id":call_id,"output":"x"}),
                    json!({"type":"message","role":"assistant","id":fake,"status":"completed",
                           "content":[]}),
                ]
            }
            _ => unreachable!("{shape:?} is not programs, hosted and standalone items"),
        }
    }

    /// Broken calls, outputs, streams and searches
    fn broken_pairs(&mut self, shape: Shape) -> Vec<Value> {
        match shape {
            Shape::CallWithoutOutput => {
                let mut out = self.maybe_reasoning();
                out.push(self.call("function_call", None).0);
                out
            }
            Shape::OrphanOutput => {
                let id = self.id("call_");
                vec![Self::output("function_call", &id, None)]
            }
            Shape::OutputBeforeCall => {
                let (call, id) = self.call("custom_tool_call", None);
                vec![Self::output("custom_tool_call", &id, None), call]
            }
            Shape::MismatchedOutput => {
                let (call, id) = self.call("custom_tool_call", None);
                vec![call, Self::output("function_call", &id, None)]
            }
            Shape::BadStream => {
                let (call, id) = self.call("shell_call", None);
                let mut chunks = self.shell_chunks(&id, false);
                chunks[0]["status"] = json!("completed");
                let mut more = chunks[0].clone();
                more["status"] = json!("in_progress");
                let mut out = vec![call];
                out.extend(chunks);
                out.push(more);
                out
            }
            Shape::AnonTwoCallsOneOutput => {
                vec![
                    self.anon_call(),
                    self.anon_call(),
                    self.anon_output("completed"),
                ]
            }
            Shape::AnonOutputAlone => vec![self.anon_output("completed")],
            Shape::ClientAnonSearch => vec![
                json!({"type":"tool_search_call","id":self.id("tsc_"),"execution":"client",
                       "arguments":{},"status":"completed"}),
                json!({"type":"tool_search_output","id":self.id("tso_"),"execution":"client",
                       "tools":[],"status":"completed"}),
            ],
            _ => unreachable!("{shape:?}"),
        }
    }

    /// Other broken forms
    fn broken_other(&mut self, shape: Shape) -> Vec<Value> {
        match shape {
            Shape::ProgramWithoutOutput => {
                let hosted = self.rng.chance(2);
                self.program(hosted, None)
            }
            Shape::DanglingReasoning => {
                let r = self.reasoning();
                vec![r, json!({"role":"user","content":"q"})]
            }
            Shape::DuplicateReasoningId => {
                let id = match self.reasoning_ids.len() {
                    0 => self.id("rs_"),
                    k => self.reasoning_ids[self.rng.below(k)].clone(),
                };
                vec![
                    json!({"type":"reasoning","id":id,"summary":[],"encrypted_content":"e"}),
                    self.msg(),
                ]
            }
            Shape::DuplicateHostedId => {
                let mut v = self.hosted("web_search_call", None);
                if !self.hosted_ids.is_empty() {
                    let k = self.hosted_ids.len();
                    v["id"] = json!(self.hosted_ids[self.rng.below(k)].clone());
                }
                vec![v]
            }
            Shape::LocalShellIdOnly => {
                let (call, id) = self.call("local_shell_call", None);
                vec![
                    call,
                    json!({"type":"local_shell_call_output","id":id,"output":"{}"}),
                ]
            }
            Shape::McpUnanswered => {
                let mut out = self.maybe_reasoning();
                out.push(json!({"type":"mcp_approval_request","id":self.id("mcpr_"),
                                "name":"t","server_label":"crm","arguments":"{}"}));
                out
            }
            Shape::Controls => vec![
                json!({"type":"compaction_trigger"}),
                json!({"type":"item_reference","id":self.id("msg_")}),
                json!({"id":self.id("msg_")}),
            ],
            Shape::ChatShapes => {
                let id = self.id("cc");
                vec![
                    json!({"role":"assistant","content":null,"tool_calls":[{"id":id,
                           "type":"function","function":{"name":"f","arguments":"{}"}}]}),
                    json!({"role":"tool","tool_call_id":id,"content":"ok"}),
                ]
            }
            Shape::HostedWrapper => {
                let id = self.id("mcpr_");
                vec![
                    json!({"type":"hosted_tool_call","name":"t","provider_data":{
                           "type":"mcp_approval_request","id":id,"name":"t",
                           "server_label":"crm","arguments":"{}"}}),
                    json!({"type":"mcp_approval_response","approval_request_id":id,
                           "approve":true}),
                ]
            }
            Shape::UnknownShapes => vec![
                json!({"type":"no_such_type","id":self.id("x_")}),
                json!({"role":"robot","content":"?"}),
                json!({"content":"no type, role or id"}),
            ],

            _ => unreachable!("{shape:?}"),
        }
    }
}

/// A history of shapes: turns of a user message and `1..=turn_max` shapes each. With
/// `broken`, about one shape in `broken` is a broken form (else only valid shapes).
pub fn sequence(m: &mut Maker, shapes: usize, broken: Option<usize>) -> (Vec<Value>, Vec<Shape>) {
    let mut items = Vec::new();
    let mut drawn = Vec::new();
    while drawn.len() < shapes {
        items.push(json!({"role":"user","content":"q"}));
        for _ in 0..1 + m.rng.below(4) {
            let shape = match broken {
                Some(k) if m.rng.chance(k) => {
                    Shape::ALL
                        [Shape::FIRST_BROKEN + m.rng.below(Shape::ALL.len() - Shape::FIRST_BROKEN)]
                }
                _ => Shape::ALL[m.rng.below(Shape::FIRST_BROKEN)],
            };
            drawn.push(shape);
            items.extend(m.make(shape));
        }
        if m.rng.chance(2) {
            items.push(m.msg());
        }
    }
    (items, drawn)
}

pub fn metas(items: &[Value]) -> Vec<ItemMeta> {
    items
        .iter()
        .map(|v| ItemMeta::from_json(v).unwrap_or_else(|e| panic!("{e}: {v}")))
        .collect()
}

/// One random case: the history (`hm`, of which the index holds `hm[..synced]`, the rest
/// appended since) and the new input `nm`. The three regions are cut from one sequence of
/// shapes at arbitrary positions, so a shape may lie across any boundary.
pub struct Case {
    pub hm: Vec<ItemMeta>,
    pub nm: Vec<ItemMeta>,
    pub synced: usize,
    pub shapes: Vec<Shape>,
    pub values: Vec<Value>,
}

impl Case {
    pub fn draw(m: &mut Maker, max_shapes: usize, broken: Option<usize>) -> Case {
        let count = 1 + m.rng.below(max_shapes);
        let (values, shapes) = sequence(m, count, broken);
        let total = values.len();
        // New input: the last 1..=6 items (often cutting a shape in two), or a user message.
        let n_new = if m.rng.chance(4) {
            0
        } else {
            1 + m.rng.below(6.min(total))
        };
        let n_hist = total - n_new;
        let hist = values[..n_hist].to_vec();
        let mut new = values[n_hist..].to_vec();
        if new.is_empty() {
            new.push(json!({"role":"user","content":"next"}));
        }
        // Appended since the index synced: 0..=8 items (often cutting a shape in two).
        let synced = n_hist - m.rng.below(9.min(n_hist + 1));
        if m.rng.chance(8) {
            // Sometimes the whole history is new to the index.
            return Case {
                hm: metas(&hist),
                nm: metas(&new),
                synced: 0,
                shapes,
                values,
            };
        }
        Case {
            hm: metas(&hist),
            nm: metas(&new),
            synced,
            shapes,
            values,
        }
    }

    /// The items after what the index holds: the appended history, then the new input.
    pub fn tail(&self) -> Vec<ItemMeta> {
        self.hm[self.synced..]
            .iter()
            .chain(self.nm.iter())
            .cloned()
            .collect()
    }
}
