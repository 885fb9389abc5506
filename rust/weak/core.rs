//! `Core`: the operations of a weak-key dictionary on Python objects, shared by the Python
//! classes in `dict.rs` (which only parse arguments and shape results).
//!
//! Each operation follows the `Shared` discipline: Python work (hashing, creating a weakref,
//! raising errors, calling `__del__` through drops) happens before or after a short locked section
//! that only reads the table and moves reference counts. A key's weakref is a `_WeakKeyRef`
//! (rust/ffi/weakkey.rs: a `weakref.ref` carrying its entry's slot index, kept current by the
//! table through `Placed`) whose callback is a builtin `METH_O` function bound to the
//! dictionary's `PyWeakRemover` (CPython calls it with no argument tuple, and no pyo3 method
//! trampoline runs); a death reads the slot from the weakref and removes the entry there, no
//! hash probe (`on_key_death`). `d[k] = v` and `del d[k]` reach `set`/`delete` through a direct
//! `mp_ass_subscript` slot (rust/ffi/mapslot.rs), so neither clones nor drops a `Py`.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyWeakrefMethods, PyWeakrefReference};

use super::shared::Shared;
use super::table::Placed;
use crate::ffi::weakkey::{self, GilRef};
use crate::ffi::weakref::{has_no_weakrefs, referent_ptr, supports_weakrefs};

/// One entry: the key's weakref (whose callback removes the entry) and the value.
pub struct Entry {
    pub wr: GilRef<PyWeakrefReference>,
    pub value: GilRef<PyAny>,
}

impl Placed for Entry {
    #[inline]
    fn place(&self, slot: usize) {
        weakkey::set_slot(&self.wr, slot);
    }

    /// Releasing the weakref runs no Python code (a weakref's deallocation only unlinks it and
    /// releases its callback, the dictionary's builtin function); releasing the value does not
    /// when someone else still holds it.
    #[inline]
    fn quiet_drop(&self) -> bool {
        self.value.is_shared()
    }
}

/// How keys are identified.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeyMode {
    /// By identity (`torch.utils.weak.WeakIdRef`, the default).
    Id,
    /// By `hash(key)` (`torch.utils.weak._WeakHashRef`, used for script objects).
    Hash,
}

/// What a dead key's weakref callback needs to find its dictionary (one per dictionary; the
/// callback is a builtin function bound to it, see `weakkey::key_died_callback`). It holds the
/// table itself (not a `Weak`: a death then costs no upgrade); the cycle this makes (table ->
/// entry -> weakref -> callback -> remover -> table) is broken by the last `Owner`, which
/// empties the table when it goes.
#[pyclass(module = "ferrodyn._C", name = "_WeakRemover", frozen)]
pub struct PyWeakRemover {
    shared: Arc<Shared<Entry>>,
}

/// A hold on a dictionary's entries by the dictionary (`Core`) or one of its iterators. When the
/// last one goes, the table is emptied (its values released, `__del__`s run after unlocking), as
/// dropping the table itself did when only these held it.
pub struct Owner(Arc<Shared<Entry>>);

impl Owner {
    fn new(shared: Arc<Shared<Entry>>) -> Owner {
        shared.add_owner();
        Owner(shared)
    }
}

impl Clone for Owner {
    fn clone(&self) -> Owner {
        Owner::new(self.0.clone())
    }
}

impl std::ops::Deref for Owner {
    type Target = Arc<Shared<Entry>>;
    #[inline]
    fn deref(&self) -> &Arc<Shared<Entry>> {
        &self.0
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if self.0.release_owner() {
            // values' `__del__`s may insert again (into a table nobody can reach any more): repeat
            // until empty; `Busy` cannot happen (no locked section runs Python code)
            Python::attach(|py| {
                while let Ok(true) = self.0.with(py, |t| {
                    let had = !t.is_empty();
                    t.clear();
                    had
                }) {}
            });
        }
    }
}

/// A key died: remove its entry (`slot`, weakref address `refid`) from the dictionary of
/// `remover`, if that is still alive. Called by the weakref callback (rust/ffi/weakkey.rs) for a
/// dead `_WeakKeyRef`, with the GIL held; drops no `Py` (entries hold `GilRef`s).
pub fn on_key_death(remover: pyo3::Borrowed<'_, '_, PyAny>, slot: usize, refid: usize) {
    let Ok(remover) = remover.cast::<PyWeakRemover>() else {
        return;
    };
    remover.get().shared.remove_dead(remover.py(), slot, refid);
}

pub struct Core {
    pub shared: Owner,
    /// The callback of every weakref this dictionary makes (bound to its `PyWeakRemover`).
    callback: Py<PyAny>,
    /// `KeyMode::Hash` when set; changed only by `__init__` (`set_mode`) while the table is empty.
    hash_mode: AtomicBool,
    /// Lookups of keys that cannot be weakly referenced raise TypeError (torch's behaviour);
    /// otherwise they simply miss (the exact dictionary).
    pub strict: bool,
}

fn busy() -> PyErr {
    PyRuntimeError::new_err("ferrodyn weak dictionary re-entered while its table was locked")
}

/// The TypeError `weakref.ref(key)` raises, or Ok when `key` can be weakly referenced.
fn check_weakrefable(key: &Bound<'_, PyAny>) -> PyResult<()> {
    if supports_weakrefs(key) {
        return Ok(());
    }
    PyWeakrefReference::new(key).map(|_| ())
}

/// Tensors whose Python object was resurrected need `_fix_weakref()` after a weakref hands them
/// out (as torch.utils.weak.WeakIdRef.__call__ does).
pub fn fix_weakref(key: &Bound<'_, PyAny>) -> PyResult<()> {
    if let Some(fix) = key.getattr_opt(intern!(key.py(), "_fix_weakref"))? {
        fix.call0()?;
    }
    Ok(())
}

/// `a, b = item` with Python's errors.
pub fn unpack2<'py>(item: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    if let Ok(t) = item.cast::<PyTuple>() {
        if t.len() == 2 {
            return Ok((t.get_item(0)?, t.get_item(1)?));
        }
    }
    let mut it = item.try_iter()?;
    let a = it.next().transpose()?;
    let b = it.next().transpose()?;
    match (a, b) {
        (Some(a), Some(b)) => {
            if it.next().transpose()?.is_some() {
                return Err(PyValueError::new_err(
                    "too many values to unpack (expected 2)",
                ));
            }
            Ok((a, b))
        }
        (a, _) => Err(PyValueError::new_err(format!(
            "not enough values to unpack (expected 2, got {})",
            usize::from(a.is_some())
        ))),
    }
}

impl Core {
    pub fn new(py: Python<'_>, mode: KeyMode, strict: bool) -> PyResult<Core> {
        let shared = Arc::new(Shared::default());
        let remover = Bound::new(
            py,
            PyWeakRemover {
                shared: shared.clone(),
            },
        )?;
        let callback = weakkey::key_died_callback(remover.as_any())?.unbind();
        Ok(Core {
            shared: Owner::new(shared),
            callback,
            hash_mode: AtomicBool::new(mode == KeyMode::Hash),
            strict,
        })
    }

    /// A dictionary of the same kind, empty.
    pub fn new_like(&self, py: Python<'_>) -> PyResult<Core> {
        Core::new(py, self.mode(), self.strict)
    }

    #[inline]
    pub fn mode(&self) -> KeyMode {
        if self.hash_mode.load(Ordering::Relaxed) {
            KeyMode::Hash
        } else {
            KeyMode::Id
        }
    }

    /// Empty the dictionary and set how keys are identified (`__init__`).
    pub fn reset(&self, py: Python<'_>, mode: KeyMode) -> PyResult<()> {
        self.clear(py)?;
        self.hash_mode
            .store(mode == KeyMode::Hash, Ordering::Relaxed);
        Ok(())
    }

    #[inline]
    fn locked<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut super::table::Table<Entry>) -> R,
    ) -> PyResult<R> {
        self.shared.with(py, f).map_err(|_| busy())
    }

    /// The table key of `key` (may run `__hash__` in hash mode).
    #[inline]
    fn key_of(&self, key: &Bound<'_, PyAny>) -> PyResult<u64> {
        match self.mode() {
            KeyMode::Id => Ok(key.as_ptr() as usize as u64),
            KeyMode::Hash => Ok(key.hash()? as u64),
        }
    }

    /// Whether `e` is the live entry of `key` (a dead weakref never matches, so an address
    /// reused by a new object is not mistaken for the dead key).
    #[inline]
    fn matches(&self, py: Python<'_>, e: &Entry, key: &Bound<'_, PyAny>) -> bool {
        let p = referent_ptr(py, &e.wr);
        match self.mode() {
            KeyMode::Id => p == key.as_ptr(),
            KeyMode::Hash => !p.is_null(),
        }
    }

    /// Table key for a lookup, with torch's errors: in hash mode the weakref is made before the
    /// lookup (so TypeError first); in id mode only a miss needs the check (`check_miss`).
    #[inline]
    fn lookup_key(&self, key: &Bound<'_, PyAny>) -> PyResult<u64> {
        let k = self.key_of(key)?;
        if self.mode() == KeyMode::Hash {
            check_weakrefable(key)?;
        }
        Ok(k)
    }

    #[inline]
    fn check_miss(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.strict && self.mode() == KeyMode::Id {
            check_weakrefable(key)?;
        }
        Ok(())
    }

    pub fn len(&self, py: Python<'_>) -> PyResult<usize> {
        self.locked(py, |t| t.len())
    }

    pub fn is_empty(&self, py: Python<'_>) -> PyResult<bool> {
        self.len(py).map(|n| n == 0)
    }

    pub fn get(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        let py = key.py();
        let k = self.lookup_key(key)?;
        let v = self.locked(py, |t| {
            t.get(k)
                .filter(|e| self.matches(py, e, key))
                .map(|e| e.value.clone_ref(py))
        })?;
        if v.is_none() {
            self.check_miss(key)?;
        }
        Ok(v)
    }

    pub fn getitem(&self, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.get(key)?
            .ok_or_else(|| PyKeyError::new_err(key.clone().unbind()))
    }

    /// `key in d`: never raises for keys that cannot be weakly referenced.
    pub fn contains(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = key.py();
        let k = match self.mode() {
            KeyMode::Id => key.as_ptr() as usize as u64,
            KeyMode::Hash => match key.hash() {
                Ok(h) if supports_weakrefs(key) => h as u64,
                Ok(_) => return Ok(false),
                Err(e) if e.is_instance_of::<PyTypeError>(py) => return Ok(false),
                Err(e) => return Err(e),
            },
        };
        self.locked(py, |t| t.get(k).is_some_and(|e| self.matches(py, e, key)))
    }

    /// `d[key] = value`.
    #[inline]
    pub fn set(&self, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.insert(key, value, true).map(drop)
    }

    /// `d.setdefault(key, default)`: the value stored under `key` afterwards.
    pub fn setdefault(
        &self,
        key: &Bound<'_, PyAny>,
        default: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        Ok(self
            .insert(key, default, false)?
            .unwrap_or_else(|| default.clone().unbind()))
    }

    /// Store `value` under `key` (`overwrite`) or keep the present value (`setdefault`).
    /// Returns the present value when it was kept (`value` is what is stored otherwise).
    ///
    /// Two probes of the table for a new key: one to find the key absent before its weakref is
    /// made (skipped for an object no weakref points to), one that inserts (or finds the key,
    /// when the code that making the weakref can run inserted it meanwhile).
    fn insert(
        &self,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        overwrite: bool,
    ) -> PyResult<Option<Py<PyAny>>> {
        let py = key.py();
        let k = self.lookup_key(key)?;
        // 1. the key is present: replace (or keep) the value; the old one is dropped unlocked.
        // An object no weakref points to is no identity key of any entry (its weakref would
        // be on its list): no probe then (a fresh object, the common new key).
        let fresh = self.mode() == KeyMode::Id && has_no_weakrefs(key);
        let hit = if fresh {
            None
        } else {
            self.locked(py, |t| match t.get_mut(k) {
                Some(e) if self.matches(py, e, key) => Some(if overwrite {
                    Err(std::mem::replace(
                        &mut e.value,
                        GilRef::new(value.clone().unbind()),
                    ))
                } else {
                    Ok(e.value.clone_ref(py))
                }),
                _ => None,
            })?
        };
        match hit {
            Some(Ok(present)) => return Ok(Some(present)),
            Some(Err(_old)) => return Ok(None),
            None => {}
        }
        // 2. absent: make the weakref unlocked (it can run the garbage collector, hence any code).
        let wr = weakkey::new_key_ref(key, self.callback.bind(py))?;
        let refid = wr.as_ptr() as usize;
        let entry = Entry {
            wr: GilRef::new(wr.unbind()),
            value: GilRef::new(value.clone().unbind()),
        };
        // 3. insert, unless that code inserted the key meanwhile; what is not kept (the new
        // entry, or the value it replaced) is dropped unlocked.
        let (present, _unused) = self.locked(py, |t| {
            match t.insert_or_present(k, refid, entry, |e| self.matches(py, e, key)) {
                Ok(()) => (None, None),
                Err((mut unused, e)) if overwrite => {
                    std::mem::swap(&mut e.value, &mut unused.value);
                    (None, Some(unused))
                }
                Err((unused, e)) => (Some(e.value.clone_ref(py)), Some(unused)),
            }
        })?;
        Ok(present)
    }

    /// `del d[key]`: false when absent (after torch's TypeError check). Clones nothing (the
    /// direct `mp_ass_subscript` slot may drop no `Py`).
    pub fn delete(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = key.py();
        let k = self.lookup_key(key)?;
        let found = self.locked(py, |t| {
            t.get(k).is_some_and(|e| self.matches(py, e, key)) && t.remove(k, true).is_some()
        })?;
        if !found {
            self.check_miss(key)?;
        }
        Ok(found)
    }

    /// Remove `key` explicitly; `None` when absent (after torch's TypeError check).
    pub fn remove(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        let py = key.py();
        let k = self.lookup_key(key)?;
        let v = self.locked(py, |t| {
            if !t.get(k).is_some_and(|e| self.matches(py, e, key)) {
                return None;
            }
            t.remove(k, true).map(|e| e.value.clone_ref(py))
        })?;
        if v.is_none() {
            self.check_miss(key)?;
        }
        Ok(v)
    }

    /// Remove and return the most recently inserted live entry.
    pub fn popitem<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(Bound<'py, PyAny>, Py<PyAny>)>> {
        let item = self.locked(py, |t| loop {
            let (k, key) = match t.last() {
                None => return None,
                Some(s) => (s.key, s.entry.wr.bind(py).upgrade()),
            };
            match key {
                None => {
                    t.remove(k, false); // died, its callback not run yet
                }
                Some(key) => {
                    let e = t.remove(k, true).expect("last() is present");
                    return Some((key, e.value.clone_ref(py)));
                }
            }
        })?;
        if let Some((key, _)) = &item {
            fix_weakref(key)?;
        }
        Ok(item)
    }

    /// Remove every entry; values are dropped after the table is already empty. Entries that
    /// their `__del__`s insert meanwhile are removed too (torch's `clear()` pops until empty).
    pub fn clear(&self, py: Python<'_>) -> PyResult<()> {
        while self.locked(py, |t| {
            let had = !t.is_empty();
            t.clear();
            had
        })? {}
        Ok(())
    }

    /// Strong references to every live (key, value), in insertion order.
    pub fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Vec<(Bound<'py, PyAny>, Py<PyAny>)>> {
        let items = self.locked(py, |t| {
            t.iter()
                .filter_map(|s| {
                    s.entry
                        .wr
                        .bind(py)
                        .upgrade()
                        .map(|k| (k, s.entry.value.clone_ref(py)))
                })
                .collect::<Vec<_>>()
        })?;
        for (k, _) in &items {
            fix_weakref(k)?;
        }
        Ok(items)
    }

    /// The weakrefs of the keys (`keyrefs()`), in insertion order.
    pub fn keyrefs(&self, py: Python<'_>) -> PyResult<Vec<Py<PyWeakrefReference>>> {
        self.locked(py, |t| t.iter().map(|s| s.entry.wr.clone_ref(py)).collect())
    }

    /// Every entry of `other` (a mapping, anything with `items()`, or what `dict()` accepts).
    pub fn update_from(&self, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = other.py();
        let source = if other.hasattr(intern!(py, "items"))? {
            other.clone()
        } else {
            py.get_type::<PyDict>().call1((other,))?
        };
        for item in source.call_method0(intern!(py, "items"))?.try_iter()? {
            let (k, v) = unpack2(&item?)?;
            self.set(&k, &v)?;
        }
        Ok(())
    }

    /// Traversal for the garbage collector: every value the table owns. The keys' weakrefs are
    /// not visited: no cycle the collector could break runs through one (a `_WeakKeyRef` holds
    /// only its callback, whose path back to the table goes through a Rust `Arc` the collector
    /// cannot see; the table releases them by reference count), and each collection that finds
    /// the dictionary in a young generation would otherwise visit one more object per entry.
    /// Unvisited, they count as referenced from outside, i.e. reachable, which is what they
    /// are while the table holds them.
    pub fn traverse(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.shared
            .try_peek_in_traverse(visit, |t| {
                for s in t.iter() {
                    visit.call(&*s.entry.value)?;
                }
                Ok(())
            })
            .unwrap_or(Ok(()))
    }
}
