//! The fingerprint chart's recursion over a batch of runs (`MultichartCUSUM.prime`).
//!
//! `MultichartCUSUM.update` takes one run's increments and computes, with numpy,
//! `up = maximum(0, up + inc_up)` (likewise `down`), restarting both at zero after a run
//! that alarmed, and alarms when the largest `maximum(up / h_up, down / h_down)` is at
//! least 1. `cusum_path` runs that recursion over a batch's increments in one call, with
//! numpy's semantics for every operation: IEEE addition and division, and `maximum`
//! propagating NaN and returning its second operand on a tie (so `maximum(0, -0.0)` is
//! `-0.0`, as numpy gives it). `tests/analyzers/detectors/test_fingerprint_detectors.py`
//! and `tests/monitor/test_engine_prepare.py` check the states it gives equal those of
//! one update at a time, bit for bit.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

/// numpy's `maximum(a, b)` for float64.
fn np_maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() || !(a > b) {
        b
    } else {
        a
    }
}

fn as_vec(py: Python<'_>, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<f64>> {
    let buf: PyBuffer<f64> = PyBuffer::get(obj)
        .map_err(|e| PyValueError::new_err(format!("{name}: a float64 array is needed ({e})")))?;
    buf.to_vec(py)
}

/// `cusum_path(inc_up, inc_down, h_up, h_down, up, down, drift)`: for `k` runs' increments
/// (`inc_up`, `inc_down`: C-contiguous float64, k x m) from the state `up`, `down` (m)
/// and whether the previous update alarmed (`drift`), the state after each run (two
/// bytearrays of k x m float64) and whether each run alarmed (a list of k bools).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn cusum_path<'py>(
    py: Python<'py>,
    inc_up: &Bound<'py, PyAny>,
    inc_down: &Bound<'py, PyAny>,
    h_up: &Bound<'py, PyAny>,
    h_down: &Bound<'py, PyAny>,
    up: &Bound<'py, PyAny>,
    down: &Bound<'py, PyAny>,
    drift: bool,
) -> PyResult<(Bound<'py, PyByteArray>, Bound<'py, PyByteArray>, Vec<bool>)> {
    let inc_up = as_vec(py, inc_up, "inc_up")?;
    let inc_down = as_vec(py, inc_down, "inc_down")?;
    let h_up = as_vec(py, h_up, "h_up")?;
    let h_down = as_vec(py, h_down, "h_down")?;
    let mut s_up = as_vec(py, up, "up")?;
    let mut s_down = as_vec(py, down, "down")?;
    let m = s_up.len();
    if s_down.len() != m || h_up.len() != m || h_down.len() != m || inc_down.len() != inc_up.len()
        || (m == 0 && !inc_up.is_empty()) || (m > 0 && inc_up.len() % m != 0)
    {
        return Err(PyValueError::new_err("cusum_path: the shapes do not agree"));
    }
    let k = if m == 0 { 0 } else { inc_up.len() / m };
    let mut out_up: Vec<u8> = Vec::with_capacity(k * m * 8);
    let mut out_down: Vec<u8> = Vec::with_capacity(k * m * 8);
    let mut fired = Vec::with_capacity(k);
    let mut drift = drift;
    for i in 0..k {
        if drift {
            s_up.iter_mut().for_each(|v| *v = 0.0);
            s_down.iter_mut().for_each(|v| *v = 0.0);
        }
        let mut nan = false;
        let mut alarm = false;
        for j in 0..m {
            let u = np_maximum(0.0, s_up[j] + inc_up[i * m + j]);
            let d = np_maximum(0.0, s_down[j] + inc_down[i * m + j]);
            s_up[j] = u;
            s_down[j] = d;
            let r = np_maximum(u / h_up[j], d / h_down[j]);
            if r.is_nan() {
                nan = true;
            } else if r >= 1.0 {
                alarm = true;
            }
        }
        // the statistic is the largest ratio (NaN when any is): an alarm at >= 1
        drift = alarm && !nan;
        fired.push(drift);
        for v in &s_up {
            out_up.extend_from_slice(&v.to_ne_bytes());
        }
        for v in &s_down {
            out_down.extend_from_slice(&v.to_ne_bytes());
        }
    }
    Ok((PyByteArray::new(py, &out_up), PyByteArray::new(py, &out_down), fired))
}
