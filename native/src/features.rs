//! What the engine reads of a closed run, in one pass over its steps.
//!
//! The Python functions are the specification and the fallback:
//! `analyzers.fingerprint._fill` (the fingerprint row), `analyzers.detectors.latency`
//! (`run_stats` then `stats_vector`: the latency sums per charted kind) and
//! `analyzers.coverage` (`path_key`, `abstract_states`, the step models and tools a
//! `CoverageTracker` counts). `tests/monitor/test_native_features.py` checks the two give
//! the same values bit for bit. The arithmetic is the Python code's, in the same order:
//! integer counts stay exact and are divided once as floats (below 2^53, where a Python
//! `int / int` and the `f64` quotient agree), `ln` and `ln_1p` are the C library's `log`
//! and `log1p`, as Python's `math.log` and `math.log1p` are. The fingerprint's five
//! logarithms are numpy's `log1p` (which differs from the C library's in the last bit for
//! some inputs), so they are left to the caller: their arguments come after the row.
//!
//! Anything outside that domain (a step whose action is not an `Action` member, a field
//! of an unexpected type, counts beyond 2^53) gives `None`, and the caller computes the
//! run with the Python functions.

use std::collections::HashSet;
use std::hash::Hash;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyList, PyString, PyTuple};

/// A set of a run's values: a vector searched in order while small (most runs have a few
/// steps), a hash set past `SMALL` values (so a long run stays linear).
struct SmallSet<T> {
    items: Vec<T>,
    hashed: Option<HashSet<T>>,
}

const SMALL: usize = 32;

impl<T: Eq + Hash + Copy> SmallSet<T> {
    fn new() -> Self {
        SmallSet { items: Vec::new(), hashed: None }
    }

    fn contains(&self, v: &T) -> bool {
        match &self.hashed {
            Some(h) => h.contains(v),
            None => self.items.contains(v),
        }
    }

    /// Adds `v`; whether it was new.
    fn insert(&mut self, v: T) -> bool {
        if let Some(h) = &mut self.hashed {
            return h.insert(v);
        }
        if self.items.contains(&v) {
            return false;
        }
        self.items.push(v);
        if self.items.len() > SMALL {
            self.hashed = Some(self.items.drain(..).collect());
        }
        true
    }

    fn len(&self) -> usize {
        match &self.hashed {
            Some(h) => h.len(),
            None => self.items.len(),
        }
    }
}

/// Integers at most this large convert to `f64` exactly.
const EXACT: i64 = 1 << 53;
/// `latency._MIN_LATENCY_S`.
const MIN_LATENCY_S: f64 = 1e-4;
/// Fingerprint columns, `analyzers.fingerprint.FIXED_FEATURES`.
const N_FIXED: usize = 14;
/// Numbers kept per latency kind, `latency.N_STATS`.
const N_STATS: usize = 6;
/// Positions of `Action` members in the tuple the plan is built with.
const LLM: usize = 0;
const TOOL: usize = 1;
const RETRIEVE: usize = 2;
const HANDOFF: usize = 3;
const AGENT: usize = 4;

/// The layout of one stream's features: its tool inventory and charted latency kinds.
#[pyclass(frozen, module = "assaywatch_native")]
pub struct FeaturePlan {
    /// The `Action` members, LLM, TOOL, RETRIEVE, HANDOFF, AGENT, OTHER, and their values.
    actions: Vec<Py<PyAny>>,
    values: Vec<String>,
    /// Tool name -> fingerprint column after the fixed ones.
    tool_index: Py<PyDict>,
    n_tools: usize,
    /// Tool name ("" for a tool step without one) -> latency slot, for `tool:<name>` kinds.
    tool_kinds: Py<PyDict>,
    llm_kind: Option<usize>,
    retrieve_kind: Option<usize>,
    n_kinds: usize,
}

fn exact(v: i64) -> Option<i64> {
    if (-EXACT..=EXACT).contains(&v) {
        Some(v)
    } else {
        None
    }
}

/// An integer field as an exact `i64` (`None`: not an int, or too large).
fn int_field(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if obj.is_instance_of::<pyo3::types::PyFloat>() {
        return None;
    }
    obj.extract::<i64>().ok().and_then(exact)
}

#[pymethods]
impl FeaturePlan {
    /// `actions`: the six `Action` members in the order LLM, TOOL, RETRIEVE, HANDOFF,
    /// AGENT, OTHER; `tool_index`: tool name -> column (0-based, after the fixed
    /// features) for `n_tools` tools; `tool_kinds`: tool name -> latency slot;
    /// `llm_kind`, `retrieve_kind`: their slots (None when not charted); `n_kinds` slots.
    #[new]
    #[pyo3(signature = (actions, tool_index, n_tools, tool_kinds, llm_kind, retrieve_kind, n_kinds))]
    fn new(
        actions: &Bound<'_, PyTuple>,
        tool_index: Bound<'_, PyDict>,
        n_tools: usize,
        tool_kinds: Bound<'_, PyDict>,
        llm_kind: Option<usize>,
        retrieve_kind: Option<usize>,
        n_kinds: usize,
    ) -> PyResult<Self> {
        if actions.len() != 6 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "actions must be the six Action members",
            ));
        }
        let mut members = Vec::with_capacity(6);
        let mut values = Vec::with_capacity(6);
        for a in actions.iter() {
            values.push(a.cast::<PyString>()?.to_str()?.to_owned());
            members.push(a.unbind());
        }
        Ok(FeaturePlan {
            actions: members,
            values,
            tool_index: tool_index.unbind(),
            n_tools,
            tool_kinds: tool_kinds.unbind(),
            llm_kind,
            retrieve_kind,
            n_kinds,
        })
    }

    /// The run's features, or None when the Python functions must compute them:
    /// `(row, path, states, models, tools_used)`. `row` is a bytearray of float64: the
    /// fingerprint (14 + n_tools, its five log columns 0, 3, 11, 12, 13 left at 0), the
    /// latency sums (6 per kind), then the five arguments of those logs (in column
    /// order). `path` is the decision path (uncut), `states` the distinct abstract states
    /// in order of first occurrence, `models` the distinct step models, `tools_used` the
    /// named tool calls in order.
    fn compute<'py>(
        &self,
        py: Python<'py>,
        steps: &Bound<'py, PyList>,
        output_length: &Bound<'py, PyAny>,
        duration_s: f64,
        root_error: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let output_length = match int_field(output_length) {
            Some(v) => v,
            None => return Ok(None),
        };
        let d = N_FIXED + self.n_tools;
        let n_lat = self.n_kinds * N_STATS;
        let mut row = vec![0.0f64; d + n_lat + 5];
        let n = steps.len();
        let mut any_error = root_error;

        let mut counts = [0i64; 6];
        let mut max_depth: i64 = 0;
        let mut tool_calls: Vec<i64> = vec![0; self.n_tools];
        let mut tokens: i64 = 0;
        let mut out_tokens: i64 = 0;
        let mut last_llm_out: i64 = 0;
        let mut lat_seen = vec![false; self.n_kinds];
        // The steps' tools, kept as their Python strings (borrowed as `&str` below); the
        // sets of a run's values are `SmallSet`s.
        let mut tool_objs: Vec<Option<Bound<'py, PyString>>> = Vec::with_capacity(n);
        // per step: (action, error); the tool is tool_objs[i]
        let mut keys: Vec<(usize, bool)> = Vec::with_capacity(n);
        let mut path = String::with_capacity(16 * n);
        // every step's state, one after the other in `state_buf`, each its (start, end)
        let mut state_buf = String::with_capacity(32 * n);
        let mut states: Vec<(usize, usize)> = Vec::with_capacity(n);
        let mut model_objs: Vec<Bound<'py, PyString>> = Vec::new();
        let tools_used = PyList::empty(py);
        let (mut prev_start, mut prev_end) = (0usize, 0usize); // in `path`; empty: "^"
        let tool_index = self.tool_index.bind(py);
        let tool_kinds = self.tool_kinds.bind(py);
        let no_tool = intern!(py, "");

        for s in steps.iter() {
            let action = s.getattr(intern!(py, "action"))?;
            let a = match self.actions.iter().position(|m| m.bind(py).is(&action)) {
                Some(i) => i,
                None => return Ok(None),
            };
            let tool_any = s.getattr(intern!(py, "tool"))?;
            let tool_obj: Option<Bound<'py, PyString>> = if tool_any.is_none() {
                None
            } else {
                match tool_any.cast_into::<PyString>() {
                    Ok(t) => Some(t),
                    Err(_) => return Ok(None),
                }
            };
            let depth = match int_field(&s.getattr(intern!(py, "depth"))?) {
                Some(v) => v,
                None => return Ok(None),
            };
            let input = match int_field(&s.getattr(intern!(py, "input_tokens"))?) {
                Some(v) => v,
                None => return Ok(None),
            };
            let output = match int_field(&s.getattr(intern!(py, "output_tokens"))?) {
                Some(v) => v,
                None => return Ok(None),
            };
            let error = s.getattr(intern!(py, "error"))?.is_truthy()?;
            let latency: f64 = match s.getattr(intern!(py, "latency_s"))?.extract() {
                Ok(v) => v,
                Err(_) => return Ok(None),
            };
            let model = s.getattr(intern!(py, "model"))?;

            // fingerprint (`_fill`)
            if depth > max_depth {
                max_depth = depth;
            }
            tokens = match exact(tokens + input + output) {
                Some(v) => v,
                None => return Ok(None),
            };
            out_tokens = match exact(out_tokens + output) {
                Some(v) => v,
                None => return Ok(None),
            };
            counts[a] += 1;
            if a == LLM {
                last_llm_out = output;
            } else if a == TOOL {
                if let Some(t) = &tool_obj {
                    if let Some(j) = tool_index.get_item(t)? {
                        let j: usize = j.extract()?;
                        if j < self.n_tools {
                            tool_calls[j] += 1;
                        }
                    }
                }
            }
            if error {
                any_error = true;
            }

            // latency sums (`run_stats`, `stats_vector`)
            let slot = match a {
                LLM => self.llm_kind,
                RETRIEVE => self.retrieve_kind,
                TOOL => {
                    let name = match &tool_obj {
                        Some(t) => t,
                        None => no_tool,
                    };
                    match tool_kinds.get_item(name)? {
                        Some(k) => Some(k.extract::<usize>()?),
                        None => None,
                    }
                }
                _ => None,
            };
            if let Some(k) = slot {
                if latency > 0.0 && k < self.n_kinds {
                    let x = (if latency > MIN_LATENCY_S { latency } else { MIN_LATENCY_S }).ln();
                    let t = if input > 0 { (input as f64).ln_1p() } else { 0.0 };
                    let v = &mut row[d + k * N_STATS..d + (k + 1) * N_STATS];
                    if lat_seen[k] {
                        v[0] += 1.0;
                        v[1] += x;
                        v[2] += x * x;
                        v[3] += t;
                        v[4] += t * t;
                        v[5] += x * t;
                    } else {
                        lat_seen[k] = true;
                        v.copy_from_slice(&[1.0, x, x * x, t, t * t, x * t]);
                    }
                }
            }

            // coverage (`path_key`, `abstract_states`, models, tools_used)
            let named = match &tool_obj {
                Some(t) => {
                    let t = t.to_str()?;
                    if t.is_empty() {
                        None
                    } else {
                        Some(t)
                    }
                }
                None => None,
            };
            if !keys.is_empty() {
                path.push('>');
            }
            let cur_start = path.len();
            path.push_str(&self.values[a]);
            if let Some(t) = named {
                path.push(':');
                path.push_str(t);
            }
            let cur_end = path.len();
            let state_start = state_buf.len();
            if keys.is_empty() {
                state_buf.push('^');
            } else {
                state_buf.push_str(&path[prev_start..prev_end]);
            }
            state_buf.push('>');
            state_buf.push_str(&path[cur_start..cur_end]);
            if error {
                state_buf.push('!');
            }
            states.push((state_start, state_buf.len()));
            (prev_start, prev_end) = (cur_start, cur_end);
            if a == TOOL && named.is_some() {
                if let Some(t) = &tool_obj {
                    tools_used.append(t)?;
                }
            }
            if model.is_truthy()? {
                match model.cast_into::<PyString>() {
                    Ok(m) => model_objs.push(m),
                    Err(_) => return Ok(None),
                }
            }
            keys.push((a, error));
            tool_objs.push(tool_obj);
        }

        // (action, tool) of step i, for the distinct pairs and the recovery pass
        let tools: Vec<Option<&str>> = tool_objs
            .iter()
            .map(|t| t.as_ref().map(|t| t.to_str()).transpose())
            .collect::<PyResult<_>>()?;
        let mut pairs: SmallSet<(usize, Option<&str>)> = SmallSet::new();
        for (i, &(a, _)) in keys.iter().enumerate() {
            pairs.insert((a, tools[i]));
        }
        // recovery: backwards, remembering which (action, tool) later succeeded
        let (mut n_err, mut n_rec) = (0i64, 0i64);
        let mut succeeded: SmallSet<(usize, Option<&str>)> = SmallSet::new();
        for (i, &(a, error)) in keys.iter().enumerate().rev() {
            let k = (a, tools[i]);
            if error {
                n_err += 1;
                if succeeded.contains(&k) {
                    n_rec += 1;
                }
            } else {
                succeeded.insert(k);
            }
        }

        let out_len = output_length.max(0) as f64;
        let logs = &mut row[d + n_lat..];
        if n > 0 {
            let nf = n as f64;
            logs.copy_from_slice(&[nf, out_len, tokens as f64, tokens as f64 / nf, duration_s]);
            row[1] = max_depth as f64;
            row[2] = pairs.len() as f64;
            row[4] = if out_tokens > 0 { last_llm_out as f64 / out_tokens as f64 } else { 0.0 };
            row[5] = counts[LLM] as f64 / nf;
            row[6] = counts[TOOL] as f64 / nf;
            row[7] = counts[RETRIEVE] as f64 / nf;
            row[8] = (counts[HANDOFF] + counts[AGENT]) as f64 / nf;
            row[10] = if n_err > 0 { n_rec as f64 / n_err as f64 } else { 0.0 };
            for (j, &c) in tool_calls.iter().enumerate() {
                if c > 0 {
                    row[N_FIXED + j] = c as f64 / nf;
                }
            }
        } else {
            logs.copy_from_slice(&[0.0, out_len, 0.0, 0.0, duration_s]);
        }
        row[9] = if any_error { 1.0 } else { 0.0 };

        let mut bytes = Vec::with_capacity(row.len() * 8);
        for v in &row {
            bytes.extend_from_slice(&v.to_ne_bytes());
        }
        let distinct = PyList::empty(py);
        let mut seen_states: SmallSet<&str> = SmallSet::new();
        for &(i, j) in &states {
            if seen_states.insert(&state_buf[i..j]) {
                distinct.append(&state_buf[i..j])?;
            }
        }
        let models = PyList::empty(py);
        let mut model_names: SmallSet<&str> = SmallSet::new();
        for m in &model_objs {
            if model_names.insert(m.to_str()?) {
                models.append(m)?;
            }
        }
        Ok(Some(PyTuple::new(
            py,
            [
                PyByteArray::new(py, &bytes).into_any(),
                PyString::new(py, &path).into_any(),
                distinct.into_any(),
                models.into_any(),
                tools_used.into_any(),
            ],
        )?))
    }
}
