//! weak: weak-key dictionaries (`WeakIdKeyDictionary` = `WeakTensorKeyDictionary`, and
//! `WeakKeyExactDictionary`) with torch.utils.weak's behaviour and a native hot path.
//!
//! - `table`: insertion-ordered identity-keyed slots (pure Rust);
//! - `shared`: the table behind a lock that is never held while Python code runs, deferred
//!   removals, live-iterator count (pure Rust);
//! - `core`: the dictionary operations on Python objects (weakref per key, callback removal);
//! - `dict`: the Python classes and their iterator;
//! - `debug`: `_debug_weak_*` introspection for the tests.
//!
//! Does not own the public names (`ferrodyn.weak` re-exports them and registers them as
//! `collections.abc.MutableMapping`).
use pyo3::prelude::*;

pub mod core;
mod debug;
pub mod dict;
pub mod shared;
pub mod table;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<dict::PyWeakIdKeyDictionary>()?;
    // before the subclass below is created: it copies the slot (rust/ffi/mapslot.rs)
    crate::ffi::mapslot::install_ass_subscript::<dict::PyWeakIdKeyDictionary>(m.py())?;
    m.add("WeakTensorKeyDictionary", m.getattr("WeakIdKeyDictionary")?)?;
    m.add_class::<dict::PyWeakKeyExactDictionary>()?;
    m.add_class::<dict::PyWeakDictIterator>()?;
    m.add_class::<core::PyWeakRemover>()?;
    m.add("_WeakKeyRef", crate::ffi::weakkey::type_object(m.py())?)?;
    debug::register(m)?;
    Ok(())
}
