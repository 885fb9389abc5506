//! Leaf checks and their lazily built explanations. Each leaf knows its source expression;
//! `check` is the hot path, `explain` runs only after a failure.
use pyo3::prelude::*;
use pyo3::types::PyWeakrefMethods;
use pyo3::types::{PyDict, PyWeakrefReference};

use super::consts::{is_showable, Const};
use super::global_state::Snapshot;
use super::shape_leaf::ShapeLeaf;
use crate::tensor::TensorSpec;

/// An object held for identity comparison: weakly where it can be (the guard fails once it
/// died and never keeps it alive), strongly otherwise (ints, None, tuples...).
pub(crate) enum IdRef {
    Weak {
        addr: usize,
        r: Py<PyWeakrefReference>,
    },
    Strong(Py<PyAny>),
}

impl IdRef {
    /// A strong reference (for types in type checks: a class rarely dies, and holding it makes
    /// the check one pointer comparison).
    pub(crate) fn strong(obj: &Bound<'_, PyAny>) -> IdRef {
        IdRef::Strong(obj.clone().unbind())
    }

    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> IdRef {
        match PyWeakrefReference::new(obj) {
            Ok(r) => IdRef::Weak {
                addr: obj.as_ptr() as usize,
                r: r.unbind(),
            },
            Err(_) => IdRef::Strong(obj.clone().unbind()),
        }
    }

    /// Whether `ptr` is this object (and it is still alive).
    #[inline]
    pub(crate) fn is(&self, py: Python<'_>, ptr: *mut pyo3::ffi::PyObject) -> bool {
        match self {
            // The referent's address read without touching reference counts: equal to `ptr`
            // only while the object is alive (a dead weakref reads null).
            IdRef::Weak { addr, r } => {
                *addr == ptr as usize && crate::ffi::guard_reads::weakref_referent(py, r) == ptr
            }
            IdRef::Strong(o) => o.as_ptr() == ptr,
        }
    }

    /// The address this leaf compares with.
    pub(crate) fn addr(&self) -> usize {
        match self {
            IdRef::Weak { addr, .. } => *addr,
            IdRef::Strong(o) => o.as_ptr() as usize,
        }
    }

    pub(crate) fn alive(&self, py: Python<'_>) -> bool {
        match self {
            IdRef::Weak { r, .. } => r.bind(py).upgrade().is_some(),
            IdRef::Strong(_) => true,
        }
    }
}

// The tensor spec is boxed: inline it made every leaf ~600 bytes (the replay checks plain
// tensors from its own packed copies, `replay::Plan`).
pub(crate) enum LeafKind {
    TypeIs(IdRef),
    Is(IdRef),
    IsNone,
    IsNotNone,
    Equals(Const),
    LengthIs(usize),
    DictKeys(Vec<Py<PyAny>>),
    /// `key not in d` for an exact dict `d` (an instance `__dict__` that must not shadow a
    /// class attribute).
    DictLacks(Py<PyAny>),
    /// `len(d[k]) == 0` for each key of a list (a module's hook dicts), one leaf.
    DictsEmpty(Box<super::dicts_empty::DictsEmpty>),
    Tensor(Box<TensorSpec>),
    GlobalState(Box<Snapshot>),
    /// No exception is being handled by the frame's caller (`sys.exception() is None`).
    NoHandledException,
    /// Several accessors at once (`Leaf::node` is None; the tree reads `AliasSpec::nodes`).
    Aliasing(Box<super::aliasing::AliasSpec>),
    /// A symbolic-shape expression over several nodes (the tree evaluates it: `node` is None).
    Shape(Box<ShapeLeaf>),
}

impl LeafKind {
    /// A key equal for two leaves exactly when they make the same check (the replay skips a
    /// leaf whose twin already passed on the same value); None where that is not evident.
    pub(crate) fn check_key(&self) -> Option<(u8, i64)> {
        Some(match self {
            LeafKind::TypeIs(a) => (0, a.addr() as i64),
            LeafKind::Is(a) => (1, a.addr() as i64),
            LeafKind::IsNone | LeafKind::Equals(Const::None) => (2, 0),
            LeafKind::IsNotNone => (3, 0),
            LeafKind::LengthIs(n) => (4, *n as i64),
            LeafKind::Equals(Const::Bool(b)) => (5, *b as i64),
            LeafKind::Equals(Const::Int(i)) => (6, *i),
            _ => return None,
        })
    }

    /// Evaluation class: cheaper classes run first across the whole tree.
    pub(crate) fn class(&self) -> u8 {
        match self {
            LeafKind::TypeIs(_) | LeafKind::Is(_) | LeafKind::IsNone | LeafKind::IsNotNone => 0,
            LeafKind::Equals(_)
            | LeafKind::LengthIs(_)
            | LeafKind::DictKeys(_)
            | LeafKind::DictLacks(_)
            | LeafKind::DictsEmpty(_) => 1,
            LeafKind::GlobalState(_) | LeafKind::NoHandledException => 2,
            LeafKind::Tensor(_) => 3,
            LeafKind::Aliasing(_) => 4,
            LeafKind::Shape(_) => 4,
        }
    }
}

pub(crate) struct Leaf {
    /// The node whose value is checked (None for global state).
    pub node: Option<usize>,
    pub kind: LeafKind,
    /// The leaf's expression, e.g. "type(L['y']) is int".
    pub expr: String,
    /// Source of the checked node (for tensor explanations).
    pub source: String,
    pub order: (u8, usize, usize),
}

impl Leaf {
    /// The hot-path check on the node's value (never raises).
    #[inline]
    pub(crate) fn check(&self, py: Python<'_>, v: Option<&Bound<'_, PyAny>>) -> bool {
        match &self.kind {
            LeafKind::GlobalState(s) => s.check(py),
            LeafKind::NoHandledException => crate::ffi::handled_exc::no_handled_exception(py),
            LeafKind::Shape(_) => false, // evaluated by the tree (GuardTree::check_shape)
            kind => match v {
                None => false,
                Some(v) => check_value(kind, py, v),
            },
        }
    }

    /// Why the leaf fails on `v` (called only after `check` returned false).
    pub(crate) fn explain(&self, py: Python<'_>, v: &Bound<'_, PyAny>) -> String {
        let got = |x: &Bound<'_, PyAny>| -> String {
            if is_showable(x) {
                x.repr()
                    .map(|r| format!(" (got {})", short(&r.to_string())))
                    .unwrap_or_default()
            } else {
                format!(" (got an object of type {})", type_name(x))
            }
        };
        match &self.kind {
            LeafKind::TypeIs(id) => {
                if !id.alive(py) {
                    format!("{} (the type has died)", self.expr)
                } else {
                    format!("{} (got {})", self.expr, type_name(v))
                }
            }
            LeafKind::Is(id) => {
                if !id.alive(py) {
                    format!("{} (the object has died)", self.expr)
                } else {
                    format!("{} (got {})", self.expr, describe_obj(v))
                }
            }
            LeafKind::IsNone | LeafKind::Equals(_) => format!("{}{}", self.expr, got(v)),
            LeafKind::IsNotNone => self.expr.clone(),
            LeafKind::LengthIs(_) => match v.len() {
                Ok(n) => format!("{} (got {n})", self.expr),
                Err(_) => format!(
                    "{} (got an object of type {} without len())",
                    self.expr,
                    type_name(v)
                ),
            },
            LeafKind::DictKeys(_) => match mapping_keys(v) {
                Some(ks) => {
                    let keys = pyo3::types::PyList::new(py, ks)
                        .and_then(|l| l.repr().map(|r| r.to_string()))
                        .unwrap_or_default();
                    format!("{} (got {})", self.expr, short(&keys))
                }
                None => format!("{} (got an object of type {})", self.expr, type_name(v)),
            },
            LeafKind::DictLacks(_) => {
                if v.cast_exact::<PyDict>().is_ok() {
                    format!("{} (the key is present)", self.expr)
                } else {
                    format!("{} (got an object of type {})", self.expr, type_name(v))
                }
            }
            LeafKind::DictsEmpty(e) => e.explain(&self.expr, v),
            LeafKind::Tensor(t) => t.explain(v, &self.source),
            LeafKind::GlobalState(s) => s.explain(py).unwrap_or_else(|| self.expr.clone()),
            LeafKind::NoHandledException => {
                format!("{} (the caller is handling an exception)", self.expr)
            }
            LeafKind::Aliasing(_) => self.expr.clone(), // explained by the tree (several values)
            LeafKind::Shape(_) => self.expr.clone(), // explained by the tree (it reads the symbols)
        }
    }
}

#[inline]
fn check_value(kind: &LeafKind, py: Python<'_>, v: &Bound<'_, PyAny>) -> bool {
    match kind {
        LeafKind::TypeIs(id) => id.is(py, v.get_type_ptr() as *mut pyo3::ffi::PyObject),
        LeafKind::Is(id) => id.is(py, v.as_ptr()),
        LeafKind::IsNone => v.is_none(),
        LeafKind::IsNotNone => !v.is_none(),
        LeafKind::Equals(c) => c.matches(v),
        LeafKind::LengthIs(n) => v.len().ok() == Some(*n),
        LeafKind::DictKeys(keys) => match v.cast_exact::<PyDict>() {
            Ok(d) => {
                d.len() == keys.len()
                    && d.keys()
                        .iter()
                        .zip(keys.iter())
                        .all(|(k, e)| same_key(py, &k, e))
            }
            // Dict subclasses (OrderedDict keeps its own order, apart from the underlying
            // dict's) and other mappings: their own `keys()`, in their order.
            Err(_) => mapping_keys(v).is_some_and(|ks| {
                ks.len() == keys.len()
                    && ks.iter().zip(keys.iter()).all(|(k, e)| same_key(py, k, e))
            }),
        },
        // anything but an exact dict fails (a recompile decides again)
        LeafKind::DictLacks(key) => v
            .cast_exact::<PyDict>()
            .is_ok_and(|d| d.contains(key.bind(py)).ok() == Some(false)),
        LeafKind::DictsEmpty(e) => e.check(v),
        LeafKind::Tensor(t) => t.check(v),
        LeafKind::GlobalState(s) => s.check(py),
        LeafKind::NoHandledException => crate::ffi::handled_exc::no_handled_exception(py),
        LeafKind::Aliasing(_) => false, // checked by the tree over its several values
        LeafKind::Shape(_) => false,    // evaluated by the tree, never on one value
    }
}

#[inline]
fn same_key(py: Python<'_>, k: &Bound<'_, PyAny>, e: &Py<PyAny>) -> bool {
    k.as_ptr() == e.as_ptr() || k.eq(e.bind(py)).unwrap_or(false)
}

/// The keys of a mapping in its own iteration order: an exact dict's directly, anything else's
/// through its `keys()` method. None when the value has no usable `keys()`.
fn mapping_keys<'py>(v: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if let Ok(d) = v.cast_exact::<PyDict>() {
        return Some(d.keys().iter().collect());
    }
    if !v.is_instance_of::<PyDict>() && !v.hasattr("keys").unwrap_or(false) {
        return None;
    }
    let ks = v.call_method0("keys").ok()?;
    ks.try_iter().ok()?.collect::<PyResult<Vec<_>>>().ok()
}

pub(crate) fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A short, safe description of an object: its repr for constants, else type and address.
pub(crate) fn describe_obj(v: &Bound<'_, PyAny>) -> String {
    if let Ok(t) = v.cast::<pyo3::types::PyType>() {
        return t
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "<type>".into());
    }
    if is_showable(v) {
        v.repr().map(|r| short(&r.to_string())).unwrap_or_default()
    } else {
        format!("<{} object at {:#x}>", type_name(v), v.as_ptr() as usize)
    }
}

pub(crate) fn short(s: &str) -> String {
    if s.chars().count() > 80 {
        let t: String = s.chars().take(77).collect();
        format!("{t}...")
    } else {
        s.to_owned()
    }
}
