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
//!
//! The module also holds two kernels of the engine, each the compiled twin of Python code
//! that stays its specification and fallback: `features` (a monitored run's fingerprint,
//! latency sums and coverage parts in one pass over its steps) and `cusum` (the fingerprint
//! chart's recursion over a primed batch).

mod classify;
mod cusum;
mod features;
mod otlp;

// The parse allocates a small buffer per string and per repeated field; mimalloc serves
// them several times faster than the system allocator (bench_ingest_cpu's decode stage).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;

use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use classify::{Classifier, Role, Seen, Slots};
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
    /// A value the byte estimate does not model (an array or map value, an attribute key
    /// given twice): the batch's estimate is then left to Python (`batch_bytes`).
    unmodelled: bool,
}

/// `sys.getsizeof` of the values the decoder makes, and the estimate's constants, as the
/// running interpreter gives them (measured by the Python side when it builds the
/// decoder; `pipeline.batch_bytes` is the specification of the estimate).
#[derive(Clone, Copy)]
struct SizeOf {
    /// An ASCII str of n characters: ascii + n.
    ascii: usize,
    /// A str of n characters whose widest is k bytes wide (1, 2, 4): compact[k] + (n+1)k.
    compact: [usize; 3],
    int_zero: usize,
    int_one: usize,
    int_digit: usize,
    bits_per_digit: u32,
    bool_true: usize,
    bool_false: usize,
    float: usize,
    none: usize,
    bytes: usize,
    record: usize,
    attr: usize,
    event: usize,
}

impl SizeOf {
    fn str(&self, s: &str) -> usize {
        if s.is_ascii() {
            return self.ascii + s.len();
        }
        let (mut n, mut widest) = (0usize, 0u32);
        for ch in s.chars() {
            n += 1;
            widest = widest.max(ch as u32);
        }
        let (k, i) = if widest < 256 { (1, 0) } else if widest < 65536 { (2, 1) } else { (4, 2) };
        self.compact[i] + (n + 1) * k
    }

    fn int(&self, v: i64) -> usize {
        if v == 0 {
            return self.int_zero;
        }
        let bits = 64 - v.unsigned_abs().leading_zeros();
        let digits = bits.div_ceil(self.bits_per_digit) as usize;
        self.int_one + (digits - 1) * self.int_digit
    }
}

fn chars(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
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
    size: SizeOf,
    /// Classifies the common GenAI span while decoding (None: the assembler classifies).
    classifier: Option<Classifier>,
    /// False: a span classified while decoding keeps an empty attribute dict
    /// (`DecodeLimits.classified_attributes`).
    classified_attributes: bool,
}

/// `obj`, no longer tracked by the cycle collector. A record, its events and their list,
/// and its `NormalizedSpan` hold strings, numbers, dicts of them and each other, never a
/// reference back: they cannot be part of a reference cycle, so reference counting frees
/// them, and a collection walking them (every young collection while a trace is pending,
/// since they outlive the youngest generation) is work for nothing. An object they refer
/// to stays tracked, and counts as referenced from outside the collected set: never
/// freed while a record holds it.
fn untracked(obj: Bound<'_, PyAny>) -> Bound<'_, PyAny> {
    // SAFETY: `obj` is a live object (we hold a reference and the GIL); untracking an
    // object the collector does not track is a no-op.
    unsafe { pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast()) };
    obj
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
    fn cut_name<'a>(&self, s: &'a str, reason: usize, c: &mut Counts) -> &'a str {
        match char_cut(s, self.max_name_chars) {
            None => s,
            Some(i) => {
                c.sanitised[reason] += 1;
                &s[..i]
            }
        }
    }

    /// A string value cut to `max_value_bytes` UTF-8 bytes.
    fn cap<'a>(&self, s: &'a str, c: &mut Counts) -> &'a str {
        if s.len() <= self.max_value_bytes {
            s
        } else {
            c.limited[LIM_TRUNCATED] += 1;
            byte_cut(s, self.max_value_bytes)
        }
    }

    /// The key's Python str and its characters when the key is kept, None when skipped.
    fn key<'py>(&self, py: Python<'py>, key: &str, c: &mut Counts) -> Option<(Bound<'py, PyString>, usize)> {
        if let Some(keep) = &self.keep_keys {
            match keep.get(key) {
                Some(Some(k)) => return Some((k.bind(py).clone(), chars(key))),
                Some(None) => {}
                None => {
                    if !self.keep_prefixes.iter().any(|p| key.starts_with(p.as_str())) {
                        return None;
                    }
                }
            }
        }
        let k = self.cut_name(key, SAN_NAME, c);
        Some((PyString::new(py, k), chars(k)))
    }

    /// The attribute dict and its bytes in the estimate (`_attrs_bytes`).
    /// `slots`: where a span's attributes are noted for the classifier.
    fn attrs<'py>(
        &self,
        py: Python<'py>,
        kvs: &[KeyValue],
        c: &mut Counts,
        mut slots: Option<&mut Slots<'py>>,
    ) -> PyResult<(Bound<'py, PyDict>, usize)> {
        let out = PyDict::new(py);
        let mut nbytes = 0usize;
        let mut kvs = kvs;
        if kvs.len() > self.max_attributes {
            c.limited[LIM_ATTRS_DROPPED] += (kvs.len() - self.max_attributes) as u64;
            kvs = &kvs[..self.max_attributes];
        }
        for kv in kvs {
            let Some((key, key_chars)) = self.key(py, &kv.key, c) else { continue };
            let (value, size) = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) if !s.is_empty() => {
                    let s = match char_cut(s, self.max_name_chars) {
                        Some(i) if self.label_keys.iter().any(|k| *k == kv.key) => {
                            c.sanitised[SAN_LABEL] += 1;
                            &s[..i]
                        }
                        _ => s.as_str(),
                    };
                    let s = self.cap(s, c);
                    (PyString::new(py, s).into_any(), self.size.str(s))
                }
                other => self.any(py, other, c)?,
            };
            if let (Some(sl), Some(cl)) = (slots.as_deref_mut(), &self.classifier) {
                match cl.role(&kv.key) {
                    Role::Slot(i) => {
                        // as `classify` sees the stored value (maybe capped)
                        sl.values[i] = Some(if value.is_none() {
                            Seen::Null
                        } else if let Ok(text) = value.cast_exact::<PyString>() {
                            Seen::Str(text.clone(), text.to_str()?.is_empty())
                        } else if value.is_exact_instance_of::<PyInt>() {
                            value.extract::<i64>().map(Seen::Int).unwrap_or(Seen::Other)
                        } else if let Ok(f) = value.cast_exact::<PyFloat>() {
                            Seen::Float(f.value())
                        } else if let Ok(b) = value.cast_exact::<PyBool>() {
                            Seen::Bool(b.is_true())
                        } else {
                            Seen::Other
                        });
                    }
                    Role::Complex => sl.complex = true,
                    Role::Ignored => {}
                }
            }
            let before = out.len();
            out.set_item(key, value)?;
            if out.len() == before {
                c.unmodelled = true; // a key given twice: the first value is gone
            }
            nbytes += self.size.attr + key_chars + size;
        }
        Ok((out, nbytes))
    }

    /// A value and its `sys.getsizeof` (arrays and maps mark the estimate unmodelled).
    fn any<'py>(&self, py: Python<'py>, v: Option<&Value>, c: &mut Counts) -> PyResult<(Bound<'py, PyAny>, usize)> {
        let z = &self.size;
        Ok(match v {
            Some(Value::StringValue(s)) => {
                let s = self.cap(s, c);
                (PyString::new(py, s).into_any(), z.str(s))
            }
            Some(Value::IntValue(i)) => ((*i).into_pyobject(py)?.into_any(), z.int(*i)),
            Some(Value::BoolValue(b)) => (
                (*b).into_pyobject(py)?.to_owned().into_any(),
                if *b { z.bool_true } else { z.bool_false },
            ),
            Some(Value::DoubleValue(f)) => (PyFloat::new(py, *f).into_any(), z.float),
            Some(Value::ArrayValue(a)) => {
                let items = a
                    .values
                    .iter()
                    .map(|x: &AnyValue| self.any(py, x.value.as_ref(), c).map(|(o, _)| o))
                    .collect::<PyResult<Vec<_>>>()?;
                c.unmodelled = true;
                (PyTuple::new(py, items)?.into_any(), 0)
            }
            Some(Value::KvlistValue(kv)) => {
                c.unmodelled = true;
                (self.attrs(py, &kv.values, c, None)?.0.into_any(), 0)
            }
            Some(Value::BytesValue(b)) => {
                let b = if b.len() <= self.max_value_bytes {
                    &b[..]
                } else {
                    c.limited[LIM_TRUNCATED] += 1;
                    &b[..self.max_value_bytes]
                };
                (PyBytes::new(py, b).into_any(), z.bytes + b.len())
            }
            Some(Value::StringValueStrindex(_)) | None => (py.None().into_bound(py), z.none),
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
                        max_events, max_name_chars, min_time_ns, span_record, span_event, sizes,
                        classify=None, classified_attributes=true))]
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
        sizes: HashMap<String, usize>,
        classify: Option<Bound<'_, PyDict>>,
        classified_attributes: bool,
    ) -> PyResult<Self> {
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
        let get = |name: &str| {
            sizes
                .get(name)
                .copied()
                .ok_or_else(|| PyValueError::new_err(format!("Decoder: sizes lacks {name}")))
        };
        let size = SizeOf {
            ascii: get("ascii")?,
            compact: [get("compact1")?, get("compact2")?, get("compact4")?],
            int_zero: get("int_zero")?,
            int_one: get("int_one")?,
            int_digit: get("int_digit")?,
            bits_per_digit: get("bits_per_digit")? as u32,
            bool_true: get("bool_true")?,
            bool_false: get("bool_false")?,
            float: get("float")?,
            none: get("none")?,
            bytes: get("bytes")?,
            record: get("record")?,
            attr: get("attr")?,
            event: get("event")?,
        };
        Ok(Decoder {
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
            size,
            classifier: classify.map(|ctx| Classifier::from_context(&ctx)).transpose()?,
            classified_attributes,
        })
    }

    /// Decode `data`: (records, rejected, limited, sanitised, spans in the request,
    /// estimated bytes of the records as `pipeline.batch_bytes` computes them or None when
    /// they hold a value the estimate here does not model), the three counters as dicts
    /// of their non-zero counts; records is None when the request holds more than
    /// `max_spans` spans. Raises ValueError when the bytes do not parse.
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
            return PyTuple::new(
                py,
                [none.clone(), empty.clone(), empty.clone(), empty, n_spans.into_pyobject(py)?.into_any(), none],
            );
        }
        let z = self.size;
        let out = PyList::empty(py);
        let record = self.span_record.bind(py);
        let event_cls = self.span_event.bind(py);
        let empty_parent = PyString::new(py, "");
        let mut last_tid: &[u8] = &[];
        let mut tid_hex = PyString::new(py, "");
        let mut nbytes = 0usize;
        for rs in &req.resource_spans {
            let (resource, resource_bytes) = match &rs.resource {
                Some(r) => self.attrs(py, &r.attributes, &mut c, None)?,
                None => (PyDict::new(py), 0),
            };
            // counted with the first record that holds it (batch_bytes: once per resource)
            let mut resource_bytes = Some(64 + resource_bytes);
            for ss in &rs.scope_spans {
                let scope_name = match &ss.scope {
                    Some(s) => PyString::new(py, self.cut_name(&s.name, SAN_NAME, &mut c)),
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
                        let name = self.cut_name(&e.name, SAN_NAME, &mut c);
                        let (attrs, attrs_bytes) = self.attrs(py, &e.attributes, &mut c, None)?;
                        nbytes += z.event + chars(name) + attrs_bytes;
                        events.append(untracked(event_cls.call1((PyString::new(py, name), e.time_unix_nano, attrs))?))?;
                    }
                    let name = self.cut_name(&sp.name, SAN_NAME, &mut c);
                    let (code, message) = match &sp.status {
                        Some(s) => (s.code, self.cap(&s.message, &mut c)),
                        None => (0, ""),
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
                    let mut slots = self.classifier.as_ref().map(|_| Slots::new());
                    let (attrs, attrs_bytes) = self.attrs(py, &sp.attributes, &mut c, slots.as_mut())?;
                    let has_parent = !parent_hex.is_empty()?;
                    let norm = match (&self.classifier, &slots) {
                        (Some(cl), Some(sl)) => {
                            cl.classify(py, sl, !events.is_empty(), name, sp.kind, has_parent, code)?
                        }
                        _ => None,
                    }
                    .unwrap_or_else(|| py.None().into_bound(py));
                    let (attrs, attrs_bytes) = if self.classified_attributes || norm.is_none() {
                        (attrs, attrs_bytes)
                    } else {
                        (PyDict::new(py), 0) // its norm holds what the pipeline reads
                    };
                    nbytes += z.record + chars(name) + chars(message) + attrs_bytes
                        + resource_bytes.take().unwrap_or(0);
                    let args: [Bound<'py, PyAny>; 14] = [
                        tid_hex.clone().into_any(),
                        PyString::new(py, &hex(sid)).into_any(),
                        parent_hex.into_any(),
                        PyString::new(py, name).into_any(),
                        start.into_pyobject(py)?.into_any(),
                        end.into_pyobject(py)?.into_any(),
                        sp.kind.into_pyobject(py)?.into_any(),
                        code.into_pyobject(py)?.into_any(),
                        PyString::new(py, message).into_any(),
                        untracked(attrs.into_any()),
                        untracked(events.into_any()),
                        resource.clone().into_any(),
                        scope_name.clone().into_any(),
                        norm,
                    ];
                    out.append(untracked(record.call1(PyTuple::new(py, args)?)?))?;
                }
            }
        }
        let estimate = if c.unmodelled {
            py.None().into_bound(py)
        } else {
            (64 + 8 * out.len() + nbytes).into_pyobject(py)?.into_any()
        };
        PyTuple::new(
            py,
            [
                out.into_any(),
                Self::counts(py, &REJECT_NAMES, &c.rejected)?.into_any(),
                Self::counts(py, &LIMITED_NAMES, &c.limited)?.into_any(),
                Self::counts(py, &SANITISED_NAMES, &c.sanitised)?.into_any(),
                n_spans.into_pyobject(py)?.into_any(),
                estimate,
            ],
        )
    }
}

/// `untrack(obj)`: `obj`, no longer tracked by the cycle collector when it was (a no-op
/// for objects the collector does not handle, such as strings). For long-lived objects
/// that cannot be part of a reference cycle (immutable tuples of strings and numbers, or
/// slots objects holding only such values and untracked objects), so that young
/// collections stop walking them; reference counting still frees them. Untracking an
/// object that could be part of a cycle leaks that cycle: callers vouch for the shape.
#[pyfunction]
fn untrack(obj: Bound<'_, PyAny>) -> Bound<'_, PyAny> {
    // SAFETY: `obj` is a live object (we hold a reference and the GIL).
    // PyObject_GC_IsTracked is false for objects without the collector's header, so the
    // header is only touched on objects that have one.
    unsafe {
        if pyo3::ffi::PyObject_GC_IsTracked(obj.as_ptr()) == 1 {
            pyo3::ffi::PyObject_GC_UnTrack(obj.as_ptr().cast());
        }
    }
    obj
}

#[pymodule]
fn assaywatch_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Decoder>()?;
    m.add_class::<features::FeaturePlan>()?;
    m.add_function(wrap_pyfunction!(untrack, m)?)?;
    m.add_function(wrap_pyfunction!(cusum::cusum_path, m)?)?;
    Ok(())
}
