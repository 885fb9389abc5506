//! The per-code cache: compiled entries (`CacheEntry`) of each code object, kept in the code's
//! `co_extra` slot (see `crate::ffi::code_extra`), looked up most-recently-hit first against
//! their guard trees (entries past the first pre-filtered by their tree's discriminator leaf), with a per-code size limit and global counters. The list is touched under the GIL only
//! (`ffi::gil_lock::GilLock`: no atomic lock); a hit on the first entry takes no snapshot of it.
//!
//! Owns: entry storage and order, the limit and its one-time warning, the counters, `reset()`.
//! Does not own: the frame hook (`crate::eval_frame`), guard evaluation (`crate::guards`).
pub mod direct;
pub mod policy;

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyDict};

use crate::ffi::code_extra;
use crate::ffi::gil_lock::GilLock;
use crate::guards::{GuardInput, GuardTree};
use direct::DirectCall;
use policy::EntryList;

/// A compiled entry for one code object (see `_C.pyi`).
#[pyclass(module = "ferrodyn._C", name = "CacheEntry", frozen)]
pub struct CacheEntry {
    func: Py<PyAny>,
    guards: Py<GuardTree>,
    backend_id: i64,
    compile_id: String,
    hits: AtomicU64,
    /// The direct call that may replace running `func` (see [`direct`]).
    direct: Option<Arc<DirectCall>>,
}

#[pymethods]
impl CacheEntry {
    #[new]
    #[pyo3(signature = (r#fn, guards, *, backend_id = 0, compile_id = String::new(), direct = None))]
    fn py_new(
        r#fn: Bound<'_, PyAny>,
        guards: Bound<'_, GuardTree>,
        backend_id: i64,
        compile_id: String,
        direct: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if !r#fn.is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "CacheEntry: fn must be callable",
            ));
        }
        Ok(CacheEntry {
            func: r#fn.unbind(),
            guards: guards.unbind(),
            backend_id,
            compile_id,
            hits: AtomicU64::new(0),
            direct: match direct {
                Some(d) if !d.is_none() => Some(Arc::new(DirectCall::parse(&d)?)),
                _ => None,
            },
        })
    }

    /// Whether a hit may call the graph directly (see `rust/cache/direct.rs`).
    #[getter]
    fn has_direct_call(&self) -> bool {
        self.direct.is_some()
    }

    #[getter(r#fn)]
    fn get_fn(&self, py: Python<'_>) -> Py<PyAny> {
        self.func.clone_ref(py)
    }

    #[getter]
    fn guards(&self, py: Python<'_>) -> Py<GuardTree> {
        self.guards.clone_ref(py)
    }

    #[getter]
    fn backend_id(&self) -> i64 {
        self.backend_id
    }

    #[getter]
    fn compile_id(&self) -> &str {
        &self.compile_id
    }

    #[getter]
    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let f = self
            .func
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_default();
        format!(
            "<CacheEntry fn={f} compile_id={:?} hits={}>",
            self.compile_id,
            self.hits()
        )
    }
}

impl CacheEntry {
    /// The entry's function.
    pub fn func(&self) -> &Py<PyAny> {
        &self.func
    }

    /// The entry's guard tree.
    pub fn tree(&self) -> &Py<GuardTree> {
        &self.guards
    }

    fn record_hit(&self) {
        bump(&self.hits);
    }
}

/// An entry as stored in a code's list (cheap to clone without the GIL).
pub type EntryRef = Arc<Py<CacheEntry>>;

/// Per-code flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CodeFlag {
    Default = 0,
    Skip = 1,
    RunOnly = 2,
}

impl CodeFlag {
    pub fn name(self) -> &'static str {
        match self {
            CodeFlag::Default => "default",
            CodeFlag::Skip => "skip",
            CodeFlag::RunOnly => "run_only",
        }
    }
}

/// Everything ferrodyn keeps for one code object (lives in its `co_extra`, dies with it).
#[derive(Default)]
pub struct CodeState {
    /// Read and written under the GIL only (no lock, no atomic per lookup).
    entries: GilLock<EntryList<EntryRef>>,
    /// The list's length, readable without the lock (the hook's pre-check).
    len: AtomicUsize,
    flag: AtomicU8,
    warned: AtomicBool,
}

impl CodeState {
    /// `f` on the entry list. `f` never runs Python code (nothing is dropped or called in
    /// it), so the list cannot be re-entered.
    fn list<R>(&self, py: Python<'_>, f: impl FnOnce(&mut EntryList<EntryRef>) -> R) -> R {
        self.entries
            .with(py, f)
            .expect("ferrodyn: the entry list was re-entered")
    }

    pub fn flag(&self) -> CodeFlag {
        match self.flag.load(Ordering::Relaxed) {
            1 => CodeFlag::Skip,
            2 => CodeFlag::RunOnly,
            _ => CodeFlag::Default,
        }
    }

    pub fn set_flag(&self, f: CodeFlag) {
        self.flag.store(f as u8, Ordering::Relaxed);
    }

    /// No entries (read without the lock; exact whenever no insert/reset runs concurrently).
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    pub fn snapshot(&self, py: Python<'_>) -> Arc<Vec<EntryRef>> {
        self.list(py, |l| l.snapshot())
    }

    pub fn at_limit(&self, py: Python<'_>) -> bool {
        self.list(py, |l| l.at_limit(cache_size_limit()))
    }

    /// Insert at the front; false (and nothing inserted) at the limit. The entry function's
    /// own code (when it is a Python function with a code other than this one) is marked SKIP,
    /// so that calling it on a hit runs its frame directly, as TorchDynamo runs a cached code's
    /// frame; the frames it calls are intercepted as usual.
    /// An entry already in the list (the same object, returned again by a callback) is
    /// moved to the front instead: no duplicates.
    pub fn insert(&self, code: &Bound<'_, PyCode>, entry: EntryRef) -> bool {
        mark_entry_code_skip(code, entry.get());
        let ptr = entry.as_ptr();
        let outcome = self.list(code.py(), |l| {
            if l.snapshot().iter().any(|e| e.as_ptr() == ptr) {
                l.promote(|e| e.as_ptr() == ptr);
                return Err((entry, true)); // already there: promoted
            }
            let r = l.insert_front(entry, cache_size_limit());
            self.len.store(l.len(), Ordering::Relaxed);
            r.map_err(|(_, refused)| (refused, false))
        });
        // Entries not kept are dropped here, outside the list access (dropping may run Python).
        match outcome {
            Ok(()) => {
                ENTRIES.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err((e, promoted)) => {
                drop(e);
                promoted
            }
        }
    }

    fn promote(&self, py: Python<'_>, entry: &EntryRef) {
        self.list(py, |l| l.promote(|e| Arc::ptr_eq(e, entry)));
    }

    /// Drop every entry and clear the flags.
    fn clear(&self, py: Python<'_>) {
        let old = self.list(py, |l| {
            self.len.store(0, Ordering::Relaxed);
            l.take_all()
        });
        self.set_flag(CodeFlag::Default);
        self.warned.store(false, Ordering::Relaxed);
        ENTRIES.fetch_sub(old.len() as i64, Ordering::Relaxed);
        drop(old); // outside the lock: may run Python code
    }

    /// True the first time it is called since the last reset (for the one-time warning).
    fn first_warning(&self) -> bool {
        !self.warned.swap(true, Ordering::Relaxed)
    }
}

impl Drop for CodeState {
    fn drop(&mut self) {
        let n = self.entries.get_mut().len();
        ENTRIES.fetch_sub(n as i64, Ordering::Relaxed);
    }
}

fn mark_entry_code_skip(code: &Bound<'_, PyCode>, entry: &CacheEntry) {
    let f = entry.func.bind(code.py());
    if !f.is_instance_of::<pyo3::types::PyFunction>() {
        return;
    }
    if let Ok(c) = f.getattr("__code__") {
        if let Ok(c) = c.cast::<PyCode>() {
            if !c.is(code) {
                if let Ok(st) = code_extra::state_or_init(c) {
                    st.set_flag(CodeFlag::Skip);
                }
            }
        }
    }
}

// Counters since the last reset.
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);
static GUARD_FAILURES: AtomicU64 = AtomicU64::new(0);
static LIMIT_REACHED: AtomicU64 = AtomicU64::new(0);
static ENTRIES: AtomicI64 = AtomicI64::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(8);

pub fn cache_size_limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// Add one to a counter that is only written with the GIL held: a plain load and store (no
/// locked read-modify-write on the hot path); the GIL serialises the writers.
#[inline]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// Count one callback call (a miss that consulted the callback).
pub fn count_miss() {
    bump(&MISSES);
}

/// Whether an entry compiled for `entry` may run for a caller of backend `current`: equal ids,
/// or either is 0 (an entry inserted without a backend, or a caller that accepts any backend:
/// run-only mode and plain callbacks).
#[inline]
pub fn backend_matches(entry: i64, current: i64) -> bool {
    entry == current || entry == 0 || current == 0
}

/// The first entry of `state` for backend `backend_id` (see [`backend_matches`]) whose guards
/// pass on `input`, moved to the front (a hit), or None; with whether a Python error may have
/// been cleared on the way (a whole tree failed, or a discriminator read raised), for the
/// caller to release. Entries of other backends are not checked.
/// The exported node values of the hit entry's tree go to `exports` (see
/// `GuardTree::check_export`). The hit is returned as its entry's function (a strong
/// reference: running it may reset the cache and drop the entry). `count_failures`: false
/// for a look-ahead whose miss is looked up again by the hook (so failures count once).
pub fn lookup<'py>(
    py: Python<'py>,
    state: &CodeState,
    input: &GuardInput<'_, 'py>,
    backend_id: i64,
    exports: &mut Vec<Bound<'py, PyAny>>,
    count_failures: bool,
) -> (Option<Hit<'py>>, bool) {
    // The first entry (the most recently hit) is checked without a snapshot of the list: a
    // strong reference (a Python incref) keeps it alive while its guards run.
    let Some(first) = state.list(py, |l| l.first().map(|e| e.bind(py).clone())) else {
        return (None, false);
    };
    // With several entries, most were compiled for other inputs (shapes, dtypes): each is
    // first tried with its discriminator leaf alone, so that a hit on the 8th entry costs
    // about a hit on the 1st.
    let many = state.len.load(Ordering::Relaxed) > 1;
    let mut errors = false;
    let mut attempt = Attempt {
        input,
        backend_id,
        many,
        count_failures,
        errors: &mut errors,
    };
    if let Some(func) = attempt.run(py, first.get(), exports) {
        return (Some(func), errors);
    }
    if !many {
        return (None, errors);
    }
    let snap = state.snapshot(py);
    for (i, e) in snap.iter().enumerate() {
        if e.as_ptr() == first.as_ptr() {
            continue;
        }
        if let Some(func) = attempt.run(py, e.get(), exports) {
            if i != 0 {
                // Most recently hit first. Promote after letting go of the snapshot, so that
                // the list is rotated in place rather than copied.
                let hit = Arc::clone(e);
                drop(snap);
                state.promote(py, &hit);
            }
            return (Some(func), errors);
        }
    }
    (None, errors)
}

/// A hit: the entry's function (a strong reference: running it may reset the cache and drop
/// the entry) and its direct call, if it has one.
pub struct Hit<'py> {
    pub func: Bound<'py, PyAny>,
    pub direct: Option<Arc<DirectCall>>,
}

/// One lookup's check of its entries (see [`lookup`]).
struct Attempt<'a, 'i, 'py> {
    input: &'a GuardInput<'i, 'py>,
    backend_id: i64,
    many: bool,
    count_failures: bool,
    errors: &'a mut bool,
}

impl<'py> Attempt<'_, '_, 'py> {
    /// The entry's function if it is of this backend and its guards pass (a hit, counted).
    fn run(
        &mut self,
        py: Python<'py>,
        entry: &CacheEntry,
        exports: &mut Vec<Bound<'py, PyAny>>,
    ) -> Option<Hit<'py>> {
        if !backend_matches(entry.backend_id, self.backend_id) {
            return None;
        }
        let tree = entry.guards.get();
        if self.many {
            if let Some(errored) = tree.quick_reject(py, self.input) {
                *self.errors |= errored;
                if self.count_failures {
                    bump(&GUARD_FAILURES);
                }
                return None;
            }
        }
        let pass = if tree.has_exports() {
            tree.check_export(py, self.input, exports)
        } else {
            tree.check_input(py, self.input)
        };
        if pass {
            entry.record_hit();
            bump(&HITS);
            return Some(Hit {
                func: entry.func.bind(py).clone(),
                direct: entry.direct.clone(),
            });
        }
        *self.errors = true;
        if self.count_failures {
            bump(&GUARD_FAILURES);
        }
        None
    }
}

/// `code` is at the limit and a frame of it will run normally: count it, and warn once per
/// code object. An error means the warning was turned into an exception (warnings filter).
pub fn limit_reached(code: &Bound<'_, PyCode>, state: &CodeState) -> PyResult<()> {
    bump(&LIMIT_REACHED);
    if state.first_warning() {
        warn_limit(code)?;
    }
    Ok(())
}

fn warn_limit(code: &Bound<'_, PyCode>) -> PyResult<()> {
    let py = code.py();
    let name: String = code
        .getattr("co_qualname")
        .and_then(|n| n.extract())
        .unwrap_or_else(|_| "?".into());
    let file: String = code
        .getattr("co_filename")
        .and_then(|n| n.extract())
        .unwrap_or_else(|_| "?".into());
    let line: i64 = code
        .getattr("co_firstlineno")
        .and_then(|n| n.extract())
        .unwrap_or(0);
    let limit = cache_size_limit();
    let msg = format!(
        "ferrodyn: function '{name}' ({file}:{line}) reached the cache size limit ({limit} entries); \
         its frames now run without compiling. Raise ferrodyn.config.cache_size_limit if the \
         recompilations are expected."
    );
    let msg = CString::new(msg.replace('\0', "?")).unwrap_or_default();
    PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), &msg, 1)
}

fn as_code<'a, 'py>(code: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyCode>> {
    code.cast::<PyCode>()
        .map_err(|_| pyo3::exceptions::PyTypeError::new_err("expected a code object"))
}

#[pyfunction]
fn cache_entries(py: Python<'_>, code: Bound<'_, PyAny>) -> PyResult<Vec<Py<CacheEntry>>> {
    let code = as_code(&code)?;
    Ok(match code_extra::state(code) {
        Some(s) => s.snapshot(py).iter().map(|e| e.clone_ref(py)).collect(),
        None => Vec::new(),
    })
}

#[pyfunction]
fn insert_entry(code: Bound<'_, PyAny>, entry: Bound<'_, CacheEntry>) -> PyResult<()> {
    let code = as_code(&code)?;
    let state = code_extra::state_or_init(code)?;
    if !state.insert(code, Arc::new(entry.unbind())) {
        limit_reached(code, state)?;
    }
    Ok(())
}

#[pyfunction]
fn set_cache_size_limit(limit: i64) -> PyResult<()> {
    if limit < 0 {
        return Err(PyValueError::new_err("cache size limit must be >= 0"));
    }
    LIMIT.store(limit as usize, Ordering::Relaxed);
    Ok(())
}

#[pyfunction]
fn get_cache_size_limit() -> usize {
    cache_size_limit()
}

#[pyfunction]
fn cache_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("hits", HITS.load(Ordering::Relaxed))?;
    d.set_item("misses", MISSES.load(Ordering::Relaxed))?;
    d.set_item("guard_failures", GUARD_FAILURES.load(Ordering::Relaxed))?;
    d.set_item("limit_reached", LIMIT_REACHED.load(Ordering::Relaxed))?;
    d.set_item("entries", ENTRIES.load(Ordering::Relaxed).max(0))?;
    Ok(d)
}

#[pyfunction]
fn reset(py: Python<'_>) {
    for code in code_extra::codes_with_state(py) {
        if let Some(s) = code_extra::state(&code) {
            s.clear(py);
        }
    }
    for c in [&HITS, &MISSES, &GUARD_FAILURES, &LIMIT_REACHED] {
        c.store(0, Ordering::Relaxed);
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CacheEntry>()?;
    m.add_function(wrap_pyfunction!(cache_entries, m)?)?;
    m.add_function(wrap_pyfunction!(insert_entry, m)?)?;
    m.add_function(wrap_pyfunction!(set_cache_size_limit, m)?)?;
    m.add_function(wrap_pyfunction!(get_cache_size_limit, m)?)?;
    m.add_function(wrap_pyfunction!(cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::backend_matches;

    #[test]
    fn entries_run_only_for_their_backend_or_zero() {
        assert!(backend_matches(3, 3));
        assert!(!backend_matches(3, 4));
        // An entry without a backend runs for every caller...
        assert!(backend_matches(0, 4));
        // ...and a caller without one (run-only, plain callbacks) runs every entry.
        assert!(backend_matches(4, 0));
        assert!(backend_matches(0, 0));
    }
}
