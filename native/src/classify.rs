//! The common case of `assaywatch.monitor.pipeline.normalize.classify`, done while decoding:
//! a span whose kind `gen_ai.operation.name` decides (rule 1), carrying no event and none of
//! the keys that make `classify` do more than read names and token counts (evaluations,
//! costs, output content, tool definitions, run marks, other dialects' keys, handoffs, ...).
//! For it the decoder builds the same `NormalizedSpan` `classify` would; for every other
//! span it gives None and the assembler calls `classify`. The Python side hands over the
//! tables (`normalize.native_classify_context`); `tests/monitor/test_native_decode.py`
//! checks every `NormalizedSpan` made here equals `classify` of the same record.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

/// What `classify` does with a key the decoder keeps.
#[derive(Clone, Copy)]
pub enum Role {
    /// The value goes to this slot (see `Slots`).
    Slot(usize),
    /// Not read by the common case (span ids of a tool call, the resource's names).
    Ignored,
    /// Read by a rule the common case does not cover: the span goes to `classify`.
    Complex,
}

// Slot layout: the operation, the tool name, then the key groups read in precedence order.
const OP: usize = 0;
const TOOL: usize = 1;
const GROUPS: [&str; 7] = [
    "agent_keys",
    "version_keys",
    "model_keys",
    "provider_keys",
    "input_keys",
    "output_keys",
    "scenario_keys",
];
const G_AGENT: usize = 0;
const G_VERSION: usize = 1;
const G_MODEL: usize = 2;
const G_PROVIDER: usize = 3;
const G_INPUT: usize = 4;
const G_OUTPUT: usize = 5;
const G_SCENARIO: usize = 6;
pub const MAX_SLOTS: usize = 40;

/// A kept attribute value, as `classify` would see it.
#[derive(Clone)]
pub enum Seen<'py> {
    Str(Bound<'py, PyString>, bool),
    Int(i64),
    /// A float (only an evaluation's score reads one).
    Float(f64),
    /// A bool (only an evaluation's pass flag reads one).
    Bool(bool),
    /// None: an unset value (`first_value` skips it).
    Null,
    /// Bytes, an array or a map: the common case gives up on it.
    Other,
}

pub struct Slots<'py> {
    pub values: [Option<Seen<'py>>; MAX_SLOTS],
    pub complex: bool,
}

impl<'py> Slots<'py> {
    pub fn new() -> Self {
        Slots { values: std::array::from_fn(|_| None), complex: false }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum KindCode {
    Tool,
    Handoff,
    Agent,
    Workflow,
    Chain,
    Other,
}

/// Slots of the evaluation keys, in the order the context lists them.
const EV_NAME: usize = 0;
const EV_LABEL: usize = 1;
const EV_SCORE: usize = 2;
const EV_PASSED: usize = 3;

/// `as_str` of a value: Err where the common case gives up (a float or bool).
fn as_str<'py>(py: Python<'py>, v: Option<&Seen<'py>>) -> Result<Option<Bound<'py, PyString>>, ()> {
    match v {
        None | Some(Seen::Null) => Ok(None),
        Some(Seen::Str(s, empty)) => Ok(if *empty { None } else { Some(s.clone()) }),
        Some(Seen::Int(i)) => Ok(Some(PyString::new(py, &i.to_string()))),
        Some(_) => Err(()),
    }
}

pub struct Classifier {
    pub roles: HashMap<String, Role>,
    pub complex_prefixes: Vec<String>,
    ops: HashMap<String, (Py<PyAny>, Py<PyAny>, KindCode)>,
    /// (first slot, number of keys) of each group of `GROUPS`.
    groups: [(usize, usize); 7],
    renames: HashMap<String, String>,
    normalized_span: Py<PyAny>,
    share: Py<PyAny>,
    /// The slots of `gen_ai.evaluation.name`, `.score.label`, `.score.value` and
    /// `assaywatch.evaluation.passed` (`values.evaluation_of`), the `Evaluation` class and
    /// the bytes an evaluation adds to `NormalizedSpan.nbytes`.
    ev_slots: [usize; 4],
    evaluation: Py<PyAny>,
    evaluation_bytes: usize,
}

/// The value `first_value` would pick in a group: the first neither None nor "".
fn first<'a, 'py>(slots: &'a Slots<'py>, (start, n): (usize, usize)) -> Option<&'a Seen<'py>> {
    slots.values[start..start + n].iter().flatten().find(|v| match v {
        Seen::Null => false,
        Seen::Str(_, empty) => !*empty,
        _ => true,
    })
}

/// `_str_at` / `as_str(first_value(...))` of a group: Ok(None) when no key holds a value,
/// Err when the value is not a string (the common case gives up).
fn name_of<'py>(slots: &Slots<'py>, group: (usize, usize)) -> Result<Option<Bound<'py, PyString>>, ()> {
    match first(slots, group) {
        None => Ok(None),
        Some(Seen::Str(s, _)) => Ok(Some(s.clone())),
        Some(_) => Err(()),
    }
}

/// `_tokens` of a group: a non-negative int, 0 without one; Err for any other value.
fn tokens_of(slots: &Slots<'_>, group: (usize, usize)) -> Result<i64, ()> {
    match first(slots, group) {
        None => Ok(0),
        Some(Seen::Int(i)) => Ok((*i).max(0)),
        Some(_) => Err(()),
    }
}

impl Classifier {
    pub fn from_context(ctx: &Bound<'_, PyDict>) -> PyResult<Self> {
        let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
            ctx.get_item(k)?
                .ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("classify context lacks {k}")))
        };
        let mut roles: HashMap<String, Role> = HashMap::new();
        roles.insert(get("op_key")?.extract()?, Role::Slot(OP));
        roles.insert(get("tool_key")?.extract()?, Role::Slot(TOOL));
        let mut groups = [(0usize, 0usize); 7];
        let mut next = 2usize;
        for (g, name) in GROUPS.iter().enumerate() {
            let keys: Vec<String> = get(name)?.extract()?;
            groups[g] = (next, keys.len());
            for k in keys {
                roles.entry(k).or_insert(Role::Slot(next));
                next += 1;
            }
        }
        let mut ev_slots = [0usize; 4];
        let ev_keys: Vec<String> = get("evaluation_keys")?.extract()?;
        if ev_keys.len() != 4 {
            return Err(pyo3::exceptions::PyValueError::new_err("classify context: four evaluation keys"));
        }
        for (i, k) in ev_keys.into_iter().enumerate() {
            ev_slots[i] = next;
            roles.entry(k).or_insert(Role::Slot(next));
            next += 1;
        }
        if next > MAX_SLOTS {
            return Err(pyo3::exceptions::PyValueError::new_err("classify context: too many keys"));
        }
        for k in get("ignored_keys")?.extract::<Vec<String>>()? {
            roles.entry(k).or_insert(Role::Ignored);
        }
        for k in get("complex_keys")?.extract::<Vec<String>>()? {
            roles.entry(k).or_insert(Role::Complex);
        }
        let mut ops = HashMap::new();
        for (op, entry) in get("op_kinds")?.cast_into::<PyDict>()?.iter() {
            let (kind, action, value): (Py<PyAny>, Py<PyAny>, String) = entry.extract()?;
            let code = match value.as_str() {
                "tool" => KindCode::Tool,
                "handoff" => KindCode::Handoff,
                "agent" => KindCode::Agent,
                "workflow" => KindCode::Workflow,
                "chain" => KindCode::Chain,
                _ => KindCode::Other,
            };
            ops.insert(op.extract::<String>()?, (kind, action, code));
        }
        Ok(Classifier {
            roles,
            complex_prefixes: get("complex_prefixes")?.extract()?,
            ops,
            groups,
            renames: get("provider_renames")?.extract()?,
            normalized_span: get("normalized_span")?.unbind(),
            share: get("share")?.unbind(),
            ev_slots,
            evaluation: get("evaluation")?.unbind(),
            evaluation_bytes: get("evaluation_bytes")?.extract()?,
        })
    }

    /// The role of a kept key (as received: the roles' keys and the prefixes are shorter
    /// than the cut a kept key may get, so the cut changes no answer): a key `classify`
    /// does not read at all is `Ignored`.
    pub fn role(&self, key: &str) -> Role {
        if let Some(r) = self.roles.get(key) {
            return *r;
        }
        if self.complex_prefixes.iter().any(|p| key.starts_with(p.as_str())) {
            return Role::Complex;
        }
        Role::Ignored
    }

    fn share<'py>(&self, py: Python<'py>, s: Option<Bound<'py, PyString>>) -> PyResult<Bound<'py, PyAny>> {
        match s {
            None => Ok(py.None().into_bound(py)),
            Some(s) => self.share.bind(py).call1((s,)),
        }
    }

    /// The span's `NormalizedSpan`, or None when `classify` must decide it.
    #[allow(clippy::too_many_arguments)]
    pub fn classify<'py>(
        &self,
        py: Python<'py>,
        slots: &Slots<'py>,
        has_events: bool,
        name: &str,
        span_kind: i32,
        has_parent: bool,
        status_code: i32,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if slots.complex || has_events {
            return Ok(None);
        }
        let Some(Seen::Str(op, _)) = &slots.values[OP] else { return Ok(None) };
        let op = op.to_str()?;
        let Some((kind, action, code)) = self.ops.get(op) else { return Ok(None) };
        let code = *code;
        let g = &self.groups;
        let attempt = || -> Result<_, ()> {
            let mut tool = None;
            match code {
                KindCode::Handoff => return Err(()),
                KindCode::Tool => {
                    // the tool's name straight from gen_ai.tool.name; not a handoff
                    let Some(Seen::Str(t, false)) = &slots.values[TOOL] else { return Err(()) };
                    let ts = t.to_str().map_err(|_| ())?;
                    if name.starts_with("handoff to ") || ts.starts_with("transfer_to_") {
                        return Err(());
                    }
                    tool = Some(t.clone());
                }
                _ => {}
            }
            let is_agent = matches!(code, KindCode::Agent | KindCode::Workflow) && op != "create_agent";
            let is_entry = span_kind == 2 || span_kind == 5;
            let may_root = is_agent || code == KindCode::Chain || is_entry || !has_parent;
            let (mut agent, mut version) = (None, None);
            if may_root {
                agent = name_of(slots, g[G_AGENT])?;
                version = name_of(slots, g[G_VERSION])?;
            }
            let provider = name_of(slots, g[G_PROVIDER])?;
            let model = name_of(slots, g[G_MODEL])?;
            let input = tokens_of(slots, g[G_INPUT])?;
            let output = tokens_of(slots, g[G_OUTPUT])?;
            let scenario = name_of(slots, g[G_SCENARIO])?;
            // `evaluation_of` of the attributes: None unless a label, score or pass flag
            // is set; a score or flag given as a string is left to `classify`
            let ev = |i: usize| slots.values[self.ev_slots[i]].as_ref();
            let set = |v: Option<&Seen<'_>>| !matches!(v, None | Some(Seen::Null));
            let evaluation = if set(ev(EV_LABEL)) || set(ev(EV_SCORE)) || set(ev(EV_PASSED)) {
                let score = match ev(EV_SCORE) {
                    None | Some(Seen::Null) | Some(Seen::Bool(_)) => None,
                    Some(Seen::Int(i)) => Some(*i as f64),
                    Some(Seen::Float(f)) => Some(*f),
                    Some(_) => return Err(()),
                }
                .filter(|f| f.is_finite());
                let passed = match ev(EV_PASSED) {
                    Some(Seen::Bool(b)) => Some(*b),
                    Some(Seen::Str(..)) => return Err(()),
                    _ => None,
                };
                Some((as_str(py, ev(EV_NAME))?, as_str(py, ev(EV_LABEL))?, score, passed))
            } else {
                None
            };
            Ok((tool, is_agent, is_entry, agent, version, provider, model, input, output, scenario, evaluation))
        };
        let Ok((tool, is_agent, is_entry, agent, version, provider, model, input, output, scenario, evaluation)) =
            attempt()
        else {
            return Ok(None);
        };
        let provider = match provider {
            Some(p) => match self.renames.get(p.to_str()?) {
                Some(new) => Some(PyString::new(py, new)),
                None => Some(p),
            },
            None => None,
        };
        // `NormalizedSpan.nbytes`: the characters of its non-empty names (no
        // evaluations, tool definitions or marks in the common case); see
        // `assemble.kept_bytes`
        let mut nbytes = 0usize;
        for s in [&tool, &agent, &version, &scenario, &model, &provider].into_iter().flatten() {
            nbytes += s.len()?;
        }
        let none = py.None().into_bound(py);
        let empty = PyTuple::empty(py).into_any();
        let evaluations = match evaluation {
            None => empty.clone(),
            Some((name, label, score, passed)) => {
                nbytes += self.evaluation_bytes;
                let ev = self.evaluation.bind(py).call1((name, label, score, passed))?;
                PyTuple::new(py, [ev])?.into_any()
            }
        };
        let args: [Bound<'py, PyAny>; 21] = [
            kind.bind(py).clone(),
            action.bind(py).clone(),
            is_agent.into_pyobject(py)?.to_owned().into_any(),
            is_entry.into_pyobject(py)?.to_owned().into_any(),
            self.share(py, tool)?,
            self.share(py, agent)?,
            self.share(py, version)?,
            self.share(py, scenario)?,
            self.share(py, model)?,
            self.share(py, provider)?,
            input.into_pyobject(py)?.into_any(),
            output.into_pyobject(py)?.into_any(),
            none.clone(),
            output.into_pyobject(py)?.into_any(),
            (status_code == 2).into_pyobject(py)?.to_owned().into_any(),
            evaluations,
            empty.clone(),
            none,
            empty,
            false.into_pyobject(py)?.to_owned().into_any(),
            nbytes.into_pyobject(py)?.into_any(),
        ];
        Ok(Some(crate::untracked(self.normalized_span.bind(py).call1(PyTuple::new(py, args)?)?)))
    }
}
