//! The "these dicts are empty" leaf: `len(d[k]) == 0` for every key `k` of a list, on one dict
//! `d` (an nn.Module's `__dict__` with its four hook dicts, or `torch.nn.modules.module`'s
//! namespace with its four global hook dicts), as one leaf instead of a node and a length leaf
//! per hook dict.
//!
//! The replay decides it from two remembered facts ([`DictsEmpty::replay`]): the holder's
//! version tag when the full path last passed it, and the addresses of the values it found
//! under the keys then. While the holder still has that version, it holds those very objects
//! (version tags are unique per dict and state: `crate::ffi::guard_reads`), so the check reads
//! each value's length and nothing else: no lookups. A hook dict is mutated in place by
//! `register_*_hook`, `handle.remove()` or `.clear()` (its own length changes, not the
//! holder's version); assigning a new hook dict (`m._forward_hooks = OrderedDict()`) or a new
//! module global changes the holder's version, and the full path decides again. Values that
//! are not an exact dict or OrderedDict leave the replay undecided (the full path reads them
//! with `len()`).
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::ffi::guard_reads::{self as raw, Held};

pub(crate) struct DictsEmpty {
    /// The keys, interned strs, in the order given.
    pub(crate) keys: Vec<Py<PyString>>,
    /// The holder's version tag when `found` was read and passed (0: nothing remembered).
    seen: AtomicU64,
    /// The addresses of the values under `keys` at version `seen`.
    found: Vec<AtomicUsize>,
}

impl DictsEmpty {
    pub(crate) fn new(py: Python<'_>, keys: &[String]) -> DictsEmpty {
        DictsEmpty {
            keys: keys
                .iter()
                .map(|k| PyString::intern(py, k).unbind())
                .collect(),
            seen: AtomicU64::new(0),
            found: keys.iter().map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// The value under each key (None: missing or unreadable).
    fn values<'py>(&self, d: &Bound<'py, PyAny>) -> Vec<Option<Bound<'py, PyAny>>> {
        let py = d.py();
        self.keys
            .iter()
            .map(|k| match d.cast_exact::<PyDict>() {
                Ok(dict) => dict.get_item(k.bind(py)).ok().flatten(),
                Err(_) => d.get_item(k.bind(py)).ok(),
            })
            .collect()
    }

    /// The full path: every key present with an empty value. A pass on an exact dict whose
    /// version did not move during the lookups (they may run Python code for odd keys) is
    /// remembered for the replay.
    pub(crate) fn check(&self, d: &Bound<'_, PyAny>) -> bool {
        let before = raw::dict_version_of(d);
        let vals = self.values(d);
        let ok = vals
            .iter()
            .all(|v| v.as_ref().is_some_and(|v| v.len().ok() == Some(0)));
        if !ok {
            return false;
        }
        let exact = vals.iter().all(|v| {
            v.as_ref()
                .is_some_and(|v| raw::held(v).exact_len().is_some())
        });
        if let (true, Some(ver)) = (exact, before.filter(|&v| v != 0)) {
            if raw::dict_version_of(d) == Some(ver) {
                // Invalidate first, so a reader never pairs the new version with old values.
                self.seen.store(0, Ordering::Relaxed);
                for (slot, v) in self.found.iter().zip(&vals) {
                    let addr = v.as_ref().map_or(0, |v| v.as_ptr() as usize);
                    slot.store(addr, Ordering::Relaxed);
                }
                self.seen.store(ver, Ordering::Relaxed);
            }
        }
        true
    }

    /// The replay: decided from the remembered values while the holder `d` has the version
    /// they were read at; None (the full path decides) otherwise.
    #[inline]
    pub(crate) fn replay(&self, d: Held) -> Option<bool> {
        let ver = raw::dict_version(d)?;
        if ver == 0 || self.seen.load(Ordering::Relaxed) != ver {
            return None;
        }
        for slot in &self.found {
            if raw::held_at(slot.load(Ordering::Relaxed)).exact_len()? != 0 {
                return Some(false);
            }
        }
        Some(true)
    }

    /// Which key fails on `d` (after `check` returned false).
    pub(crate) fn explain(&self, expr: &str, d: &Bound<'_, PyAny>) -> String {
        let py = d.py();
        for (k, v) in self.keys.iter().zip(self.values(d)) {
            let k = super::access::quote(&k.bind(py).to_string());
            match v {
                None => return format!("{expr} ({k} could not be read)"),
                Some(v) => match v.len() {
                    Ok(0) => {}
                    Ok(n) => return format!("{expr} (len of {k} is {n})"),
                    Err(_) => {
                        return format!(
                            "{expr} ({k} holds an object of type {} without len())",
                            super::leaves::type_name(&v)
                        )
                    }
                },
            }
        }
        expr.to_owned()
    }
}
