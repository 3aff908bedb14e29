//! assaywatch's compiled OTLP trace decoder.
//!
//! It turns a serialized `ExportTraceServiceRequest` into the same `SpanRecord` objects,
//! with the same limits, sanitising and counters, as the Python decoder
//! (`assaywatch.monitor.receivers.otlp.decode.records_from_request`), whose docstrings are
//! the specification; `tests/monitor/test_native_decode.py` checks the two agree, on the
//! decoder's own test cases and on generated requests. The Python side keeps the request
//! level checks (element counting before the parse) and turns a parse error into its
//! `DecodeError` by decoding the request again with upb, so the messages and the verdict on
//! a malformed request are upb's.
//!
//! The protobuf parse runs without the GIL; building the Python objects holds it.

mod otlp;

// The parse allocates a small buffer per string and per repeated field; mimalloc serves
// them several times faster than the system allocator (bench_ingest_cpu's decode stage).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;

use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};

use otlp::any_value::Value;
use otlp::{AnyValue, ExportTraceServiceRequest, KeyValue};

// Counter slots, in the order of the names below (the Python decoder's counter labels).
const LIM_TRUNCATED: usize = 0;
const LIM_ATTRS_DROPPED: usize = 1;
const LIM_EVENTS_DROPPED: usize = 2;
const LIMITED_NAMES: [&str; 3] = [
    "attribute_value_truncated",
    "attributes_dropped",
    "events_dropped",
];

const SAN_NAME: usize = 0;
const SAN_LABEL: usize = 1;
const SAN_END_BEFORE_START: usize = 2;
const SAN_OUT_OF_RANGE: usize = 3;
const SANITISED_NAMES: [&str; 4] = [
    "name_truncated",
    "label_value_truncated",
    "end_before_start",
    "time_out_of_range",
];

const REJECT_NAMES: [&str; 5] = [
    "missing_trace_id",
    "invalid_trace_id",
    "missing_span_id",
    "invalid_span_id",
    "invalid_parent_span_id",
];

#[derive(Default)]
struct Counts {
    rejected: [u64; 5],
    limited: [u64; 3],
    sanitised: [u64; 4],
}

/// The limits of one `DecodeLimits`, and the record classes, kept between calls.
#[pyclass(frozen, module = "assaywatch_native")]
struct Decoder {
    /// None: every attribute is kept. Else the kept keys, each with its Python str made
    /// once (dict keys shared by every record: their hash is computed once).
    /// A kept key longer than `max_name_chars` maps to None: it is cut (and counted) at
    /// each use, as any other long name.
    keep_keys: Option<HashMap<String, Option<Py<PyString>>>>,
    keep_prefixes: Vec<String>,
    label_keys: Vec<String>,
    max_value_bytes: usize,
    max_attributes: usize,
    max_events: usize,
    max_name_chars: usize,
    min_time_ns: u64,
    span_record: Py<PyAny>,
    span_event: Py<PyAny>,
}

/// The first `n` characters of `s` when it has more (its byte length otherwise).
fn char_cut(s: &str, n: usize) -> Option<usize> {
    if s.len() <= n {
        return None; // at most n bytes: at most n characters
    }
    s.char_indices().nth(n).map(|(i, _)| i)
}

/// The longest prefix of `s` of at most `cap` bytes that ends on a character boundary.
fn byte_cut(s: &str, cap: usize) -> &str {
    let mut i = cap.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    &s[..i]
}

fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(b.len() * 2);
    for &x in b {
        out.push(DIGITS[(x >> 4) as usize] as char);
        out.push(DIGITS[(x & 15) as usize] as char);
    }
    out
}

fn reject_reason(trace_id: &[u8], span_id: &[u8], parent: &[u8]) -> Option<usize> {
    if trace_id.is_empty() {
        return Some(0);
    }
    if trace_id.len() != 16 || trace_id.iter().all(|&x| x == 0) {
        return Some(1);
    }
    if span_id.is_empty() {
        return Some(2);
    }
    if span_id.len() != 8 || span_id.iter().all(|&x| x == 0) {
        return Some(3);
    }
    if !parent.is_empty() && parent.len() != 8 {
        return Some(4);
    }
    None
}

impl Decoder {
    /// A name (span, event, scope, attribute key) cut to `max_name_chars` characters.
    fn name<'py>(&self, py: Python<'py>, s: &str, reason: usize, c: &mut Counts) -> Bound<'py, PyString> {
        match char_cut(s, self.max_name_chars) {
            None => PyString::new(py, s),
            Some(i) => {
                c.sanitised[reason] += 1;
                PyString::new(py, &s[..i])
            }
        }
    }

    /// A string value cut to `max_value_bytes` UTF-8 bytes.
    fn capped<'py>(&self, py: Python<'py>, s: &str, c: &mut Counts) -> Bound<'py, PyString> {
        if s.len() <= self.max_value_bytes {
            PyString::new(py, s)
        } else {
            c.limited[LIM_TRUNCATED] += 1;
            PyString::new(py, byte_cut(s, self.max_value_bytes))
        }
    }

    /// The key's Python str when the key is kept, None when it is skipped.
    fn key<'py>(&self, py: Python<'py>, key: &str, c: &mut Counts) -> Option<Bound<'py, PyString>> {
        if let Some(keep) = &self.keep_keys {
            match keep.get(key) {
                Some(Some(k)) => return Some(k.bind(py).clone()),
                Some(None) => return Some(self.name(py, key, SAN_NAME, c)),
                None => {}
            }
            if !self.keep_prefixes.iter().any(|p| key.starts_with(p.as_str())) {
                return None;
            }
        }
        Some(self.name(py, key, SAN_NAME, c))
    }

    fn attrs<'py>(&self, py: Python<'py>, kvs: &[KeyValue], c: &mut Counts) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let mut kvs = kvs;
        if kvs.len() > self.max_attributes {
            c.limited[LIM_ATTRS_DROPPED] += (kvs.len() - self.max_attributes) as u64;
            kvs = &kvs[..self.max_attributes];
        }
        for kv in kvs {
            let Some(key) = self.key(py, &kv.key, c) else { continue };
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) if !s.is_empty() => {
                    match char_cut(s, self.max_name_chars) {
                        Some(i) if self.label_keys.iter().any(|k| *k == kv.key) => {
                            c.sanitised[SAN_LABEL] += 1;
                            self.capped(py, &s[..i], c).into_any()
                        }
                        _ => self.capped(py, s, c).into_any(),
                    }
                }
                other => self.any(py, other, c)?,
            };
            out.set_item(key, value)?;
        }
        Ok(out)
    }

    fn any<'py>(&self, py: Python<'py>, v: Option<&Value>, c: &mut Counts) -> PyResult<Bound<'py, PyAny>> {
        Ok(match v {
            Some(Value::StringValue(s)) => self.capped(py, s, c).into_any(),
            Some(Value::IntValue(i)) => (*i).into_pyobject(py)?.into_any(),
            Some(Value::BoolValue(b)) => (*b).into_pyobject(py)?.to_owned().into_any(),
            Some(Value::DoubleValue(f)) => PyFloat::new(py, *f).into_any(),
            Some(Value::ArrayValue(a)) => {
                let items = a
                    .values
                    .iter()
                    .map(|x: &AnyValue| self.any(py, x.value.as_ref(), c))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)?.into_any()
            }
            Some(Value::KvlistValue(kv)) => self.attrs(py, &kv.values, c)?.into_any(),
            Some(Value::BytesValue(b)) => {
                if b.len() <= self.max_value_bytes {
                    PyBytes::new(py, b).into_any()
                } else {
                    c.limited[LIM_TRUNCATED] += 1;
                    PyBytes::new(py, &b[..self.max_value_bytes]).into_any()
                }
            }
            Some(Value::StringValueStrindex(_)) | None => py.None().into_bound(py),
        })
    }

    fn counts<'py>(py: Python<'py>, names: &[&str], values: &[u64]) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, &n) in names.iter().zip(values) {
            if n > 0 {
                d.set_item(*name, n)?;
            }
        }
        Ok(d)
    }
}

#[pymethods]
impl Decoder {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (keep_keys, keep_prefixes, label_keys, max_value_bytes, max_attributes,
                        max_events, max_name_chars, min_time_ns, span_record, span_event))]
    fn new(
        py: Python<'_>,
        keep_keys: Option<Vec<String>>,
        keep_prefixes: Vec<String>,
        label_keys: Vec<String>,
        max_value_bytes: usize,
        max_attributes: usize,
        max_events: usize,
        max_name_chars: usize,
        min_time_ns: u64,
        span_record: Py<PyAny>,
        span_event: Py<PyAny>,
    ) -> Self {
        let keep_keys = keep_keys.map(|keys| {
            keys.into_iter()
                .map(|k| {
                    let s = match char_cut(&k, max_name_chars) {
                        None => Some(PyString::intern(py, &k).unbind()),
                        Some(_) => None,
                    };
                    (k, s)
                })
                .collect()
        });
        Decoder {
            keep_keys,
            keep_prefixes,
            label_keys,
            max_value_bytes,
            max_attributes,
            max_events,
            max_name_chars,
            min_time_ns,
            span_record,
            span_event,
        }
    }

    /// Decode `data`: (records, rejected, limited, sanitised, spans in the request), the
    /// three counters as dicts of their non-zero counts; records is None when the request
    /// holds more than `max_spans` spans. Raises ValueError when the bytes do not parse.
    #[pyo3(signature = (data, max_ns, max_spans=None))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
        max_ns: u64,
        max_spans: Option<usize>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let req = py
            .detach(|| ExportTraceServiceRequest::decode(data))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let n_spans: usize = req
            .resource_spans
            .iter()
            .flat_map(|rs| rs.scope_spans.iter())
            .map(|ss| ss.spans.len())
            .sum();
        let mut c = Counts::default();
        if max_spans.is_some_and(|m| n_spans > m) {
            let none = py.None().into_bound(py);
            let empty = PyDict::new(py).into_any();
            return PyTuple::new(py, [none, empty.clone(), empty.clone(), empty, n_spans.into_pyobject(py)?.into_any()]);
        }
        let out = PyList::empty(py);
        let record = self.span_record.bind(py);
        let event_cls = self.span_event.bind(py);
        let empty_parent = PyString::new(py, "");
        let mut last_tid: &[u8] = &[];
        let mut tid_hex = PyString::new(py, "");
        for rs in &req.resource_spans {
            let resource = match &rs.resource {
                Some(r) => self.attrs(py, &r.attributes, &mut c)?,
                None => PyDict::new(py),
            };
            for ss in &rs.scope_spans {
                let scope_name = match &ss.scope {
                    Some(s) => self.name(py, &s.name, SAN_NAME, &mut c),
                    None => PyString::new(py, ""),
                };
                for sp in &ss.spans {
                    let (tid, sid, parent) = (&sp.trace_id[..], &sp.span_id[..], &sp.parent_span_id[..]);
                    if let Some(bad) = reject_reason(tid, sid, parent) {
                        c.rejected[bad] += 1;
                        continue;
                    }
                    if tid != last_tid {
                        last_tid = tid;
                        tid_hex = PyString::new(py, &hex(tid));
                    }
                    let events = PyList::empty(py);
                    let mut evs = &sp.events[..];
                    if evs.len() > self.max_events {
                        c.limited[LIM_EVENTS_DROPPED] += (evs.len() - self.max_events) as u64;
                        evs = &evs[..self.max_events];
                    }
                    for e in evs {
                        let name = self.name(py, &e.name, SAN_NAME, &mut c);
                        let attrs = self.attrs(py, &e.attributes, &mut c)?;
                        events.append(event_cls.call1((name, e.time_unix_nano, attrs))?)?;
                    }
                    let name = self.name(py, &sp.name, SAN_NAME, &mut c);
                    let (code, message) = match &sp.status {
                        Some(s) => (s.code, self.capped(py, &s.message, &mut c)),
                        None => (0, PyString::new(py, "")),
                    };
                    let start = sp.start_time_unix_nano;
                    let mut end = sp.end_time_unix_nano;
                    if !(self.min_time_ns <= start && start <= end && end <= max_ns) {
                        let ok = |t: u64| self.min_time_ns <= t && t <= max_ns;
                        if !(ok(start) && ok(end)) {
                            c.sanitised[SAN_OUT_OF_RANGE] += 1;
                        }
                        if end < start {
                            c.sanitised[SAN_END_BEFORE_START] += 1;
                            end = start;
                        }
                    }
                    let parent_hex = if parent.is_empty() || parent.iter().all(|&x| x == 0) {
                        empty_parent.clone()
                    } else {
                        PyString::new(py, &hex(parent))
                    };
                    let attrs = self.attrs(py, &sp.attributes, &mut c)?;
                    let args: [Bound<'py, PyAny>; 13] = [
                        tid_hex.clone().into_any(),
                        PyString::new(py, &hex(sid)).into_any(),
                        parent_hex.into_any(),
                        name.into_any(),
                        start.into_pyobject(py)?.into_any(),
                        end.into_pyobject(py)?.into_any(),
                        sp.kind.into_pyobject(py)?.into_any(),
                        code.into_pyobject(py)?.into_any(),
                        message.into_any(),
                        attrs.into_any(),
                        events.into_any(),
                        resource.clone().into_any(),
                        scope_name.clone().into_any(),
                    ];
                    out.append(record.call1(PyTuple::new(py, args)?)?)?;
                }
            }
        }
        PyTuple::new(
            py,
            [
                out.into_any(),
                Self::counts(py, &REJECT_NAMES, &c.rejected)?.into_any(),
                Self::counts(py, &LIMITED_NAMES, &c.limited)?.into_any(),
                Self::counts(py, &SANITISED_NAMES, &c.sanitised)?.into_any(),
                n_spans.into_pyobject(py)?.into_any(),
            ],
        )
    }
}

#[pymodule]
fn assaywatch_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Decoder>()?;
    Ok(())
}
