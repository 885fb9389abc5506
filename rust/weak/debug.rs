//! Read-only introspection of the weak dictionaries for tests/test_weak_keyref.py (names start
//! with `_debug_`; not part of the `_C.pyi` contract).
use pyo3::exceptions::PyAssertionError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use super::dict::PyWeakIdKeyDictionary;
use crate::ffi::{mapslot, weakkey};

/// (weakref.ref's basicsize, the slot field's offset, `_WeakKeyRef`'s basicsize).
#[pyfunction]
fn _debug_weak_keyref_layout(py: Python<'_>) -> PyResult<(usize, usize, usize)> {
    weakkey::layout(py)
}

/// The slot recorded in a key's weakref (None: not a `_WeakKeyRef`, or not placed).
#[pyfunction]
fn _debug_weak_keyref_slot(wr: &Bound<'_, PyAny>) -> Option<usize> {
    weakkey::slot_of(wr)
}

/// The table's shape: live entries, slots (live and tombstones), index entries (live and
/// stale), deaths queued while the table was locked.
#[pyfunction]
fn _debug_weak_table<'py>(d: &Bound<'py, PyWeakIdKeyDictionary>) -> PyResult<Bound<'py, PyDict>> {
    let shared = &d.get().core.shared;
    let out = PyDict::new(d.py());
    let (len, slots, index) = shared
        .try_peek(d.py(), |t| (t.len(), t.slot_count(), t.index_len()))
        .ok_or_else(|| PyAssertionError::new_err("table locked"))?;
    out.set_item("len", len)?;
    out.set_item("slots", slots)?;
    out.set_item("index", index)?;
    out.set_item("pending", shared.pending_count())?;
    Ok(out)
}

/// Check the table's invariants and that every live entry's weakref names the entry's slot;
/// raises AssertionError naming the first violation.
#[pyfunction]
fn _debug_weak_check(d: &Bound<'_, PyWeakIdKeyDictionary>) -> PyResult<()> {
    let r = d
        .get()
        .core
        .shared
        .try_peek(d.py(), |t| {
            t.check_invariants()?;
            let mut from = 0;
            while let Some((i, s)) = t.next_live(from) {
                let got = weakkey::slot_of(s.entry.wr.bind(d.py()).as_any());
                if got != Some(i) {
                    return Err(format!("entry at slot {i}: its weakref says {got:?}"));
                }
                from = i + 1;
            }
            Ok(())
        })
        .unwrap_or_else(|| Err("table locked".to_string()));
    r.map_err(PyAssertionError::new_err)
}

/// Whether `tp`'s `d[k] = v` / `del d[k]` slot is the direct one (rust/ffi/mapslot.rs).
#[pyfunction]
fn _debug_weak_direct_setitem(tp: &Bound<'_, PyType>) -> bool {
    mapslot::has_direct_ass_subscript::<PyWeakIdKeyDictionary>(tp)
}

/// (instances on `_WeakKeyRef`'s free list, its capacity).
#[pyfunction]
fn _debug_weak_free_list(py: Python<'_>) -> (usize, usize) {
    (weakkey::free_list_len(py), weakkey::FREE_LIST_CAP)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_debug_weak_free_list, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_weak_direct_setitem, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_weak_keyref_layout, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_weak_keyref_slot, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_weak_table, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_weak_check, m)?)?;
    Ok(())
}
