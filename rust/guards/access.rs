//! Accessors: how a node's value is computed from its parent's (or, for roots, from the input).
//! A failed access (missing attribute or key, empty cell, a raising property) yields `None`,
//! which fails every leaf below it; nothing here raises.
use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple};

use super::{GuardInput, Locals};
use crate::ffi::object as raw;

/// One step of a path. Roots read the input; the rest read their parent's value.
pub(crate) enum Access {
    Local {
        index: usize,
        name: Py<PyString>,
        hint: DictHint,
    },
    Global(Py<PyString>),
    Builtin(Py<PyString>),
    Closure(usize),
    Attr(Py<PyString>),
    /// `key` with, for int keys, the index used on exact lists and tuples.
    Item {
        key: Py<PyAny>,
        index: Option<isize>,
        hint: DictHint,
    },
    DictOf,
    TypeOf,
    LenOf,
    /// The `index`-th element of an exact set or frozenset (or key of an exact dict or
    /// defaultdict) in iteration order.
    SetItem(usize),
    /// The `index`-th value of an exact dict or defaultdict in insertion order (the value of
    /// a key that is reached by position: a tensor key, or any key of a defaultdict).
    DictValue(usize),
    /// `dict.__getitem__(parent, key)`: the item in the storage of any dict instance (a subclass
    /// included), read without running its `__getitem__` or `__missing__` overrides.
    DictItem(Py<PyAny>),
    TensorSize(i64),
    TensorStride(i64),
}

/// Where in an exact dict this accessor's key was last found (see
/// `crate::ffi::object::dict_get_at`); a racy hint, never trusted without the identity check.
#[derive(Default)]
pub(crate) struct DictHint(AtomicUsize);

const NO_HINT: usize = usize::MAX;
/// Dicts longer than this are not scanned for a hint.
const HINT_SCAN: usize = 64;

impl DictHint {
    pub(crate) fn new() -> DictHint {
        DictHint(AtomicUsize::new(NO_HINT - 1))
    }

    /// The remembered entry position, if any.
    #[inline]
    pub(crate) fn position(&self) -> Option<usize> {
        let h = self.0.load(Ordering::Relaxed);
        (h < NO_HINT - 1).then_some(h)
    }

    /// `d[key]`, trying the remembered position first.
    #[inline]
    fn get<'py>(
        &self,
        d: &Bound<'py, PyDict>,
        key: &Bound<'py, PyAny>,
    ) -> Option<Bound<'py, PyAny>> {
        let h = self.0.load(Ordering::Relaxed);
        if h < NO_HINT - 1 {
            if let Some(v) = raw::dict_get_at(d, key.as_ptr(), h) {
                return Some(v);
            }
        }
        let v = d.get_item(key).ok().flatten()?;
        if h != NO_HINT {
            // Remember where the identical key sits; if it is only equal (another object),
            // stop trying.
            let pos = raw::dict_position_of(d, key.as_ptr(), HINT_SCAN.min(d.len()));
            self.0.store(pos.unwrap_or(NO_HINT), Ordering::Relaxed);
        }
        Some(v)
    }
}

/// What makes two paths the same (deduplication key), without pyo3 types.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) enum AccessKey {
    Local(usize, String),
    Global(String),
    Builtin(String),
    Closure(usize),
    Attr(String),
    Item(String),
    DictOf,
    TypeOf,
    LenOf,
    SetItem(usize),
    DictValue(usize),
    DictItem(String),
    TensorSize(i64),
    TensorStride(i64),
}

impl AccessKey {
    /// The node's source expression given its parent's.
    pub(crate) fn source(&self, parent: &str, key_repr: &str) -> String {
        match self {
            AccessKey::Local(_, n) => format!("L[{}]", quote(n)),
            AccessKey::Global(n) => format!("G[{}]", quote(n)),
            AccessKey::Builtin(n) => format!("B[{}]", quote(n)),
            AccessKey::Closure(_) => format!("C[{key_repr}]"),
            AccessKey::Attr(n) => format!("{parent}.{n}"),
            AccessKey::Item(_) => format!("{parent}[{key_repr}]"),
            AccessKey::DictOf => format!("{parent}.__dict__"),
            AccessKey::TypeOf => format!("type({parent})"),
            AccessKey::LenOf => format!("len({parent})"),
            AccessKey::SetItem(i) => format!("list({parent})[{i}]"),
            AccessKey::DictValue(i) => format!("list({parent}.values())[{i}]"),
            AccessKey::DictItem(_) => format!("dict.__getitem__({parent}, {key_repr})"),
            AccessKey::TensorSize(d) => format!("{parent}.size()[{d}]"),
            AccessKey::TensorStride(d) => format!("{parent}.stride()[{d}]"),
        }
    }
}

static DEFAULTDICT: pyo3::sync::PyOnceLock<Option<Py<pyo3::types::PyType>>> =
    pyo3::sync::PyOnceLock::new();

/// `parent` as a dict whose storage order is its iteration order and whose storage can be read
/// without running Python code: an exact dict or an exact `collections.defaultdict` (its
/// `d[k]` would run `__missing__`; reading by position never does). None for anything else
/// (an OrderedDict keeps its own order apart from the storage's).
fn positional_dict<'a, 'py>(parent: &'a Bound<'py, PyAny>) -> Option<&'a Bound<'py, PyDict>> {
    if let Ok(d) = parent.cast_exact::<PyDict>() {
        return Some(d);
    }
    let py = parent.py();
    let dd = DEFAULTDICT.get_or_init(py, || {
        py.import("collections")
            .and_then(|m| m.getattr("defaultdict"))
            .and_then(|t| t.cast_into::<pyo3::types::PyType>().map_err(Into::into))
            .map(|t| t.unbind())
            .ok()
    });
    let dd = dd.as_ref()?;
    if parent.get_type().as_ptr() != dd.as_ptr() {
        return None;
    }
    parent.cast::<PyDict>().ok()
}

/// Python-style single-quoted string literal (for names, which are identifiers in practice).
pub(crate) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Defaults a tree falls back on when the input does not carry globals/builtins.
pub(crate) struct Defaults<'a, 'py> {
    pub globals: Option<&'a Bound<'py, PyDict>>,
    pub builtins: Option<&'a Bound<'py, PyDict>>,
}

impl Access {
    /// Read a root node's value from the input.
    pub(crate) fn read_root<'py>(
        &self,
        py: Python<'py>,
        input: &GuardInput<'_, 'py>,
        defaults: &Defaults<'_, 'py>,
    ) -> Option<Bound<'py, PyAny>> {
        match self {
            Access::Local { index, name, hint } => match &input.locals {
                Locals::Slots(s) => s.get(py, *index).map(|b| b.to_owned()),
                Locals::Mapping(m) => {
                    if let Ok(d) = m.cast_exact::<PyDict>() {
                        hint.get(d, name.bind(py).as_any())
                    } else {
                        m.get_item(name.bind(py)).ok()
                    }
                }
            },
            Access::Global(name) => {
                let g = input.globals.or(defaults.globals)?;
                g.get_item(name.bind(py)).ok().flatten()
            }
            Access::Builtin(name) => {
                let b = input.builtins.or(defaults.builtins)?;
                b.get_item(name.bind(py)).ok().flatten()
            }
            Access::Closure(index) => {
                let cells = input.closure?;
                let cell = cells.get_borrowed_item(*index).ok()?;
                raw::cell_contents(&cell)
            }
            _ => None,
        }
    }

    /// Read a child node's value from its parent's.
    pub(crate) fn read_child<'py>(&self, parent: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
        let py = parent.py();
        match self {
            Access::Attr(name) => parent.getattr(name.bind(py)).ok(),
            Access::Item { key, index, hint } => {
                if let Some(i) = *index {
                    if let Ok(t) = parent.cast_exact::<PyTuple>() {
                        let n = t.len() as isize;
                        let j = if i < 0 { i + n } else { i };
                        return if (0..n).contains(&j) {
                            t.get_item(j as usize).ok()
                        } else {
                            None
                        };
                    }
                    if let Ok(l) = parent.cast_exact::<PyList>() {
                        let n = l.len() as isize;
                        let j = if i < 0 { i + n } else { i };
                        return if (0..n).contains(&j) {
                            l.get_item(j as usize).ok()
                        } else {
                            None
                        };
                    }
                }
                if let Ok(d) = parent.cast_exact::<PyDict>() {
                    return hint.get(d, key.bind(py));
                }
                parent.get_item(key.bind(py)).ok()
            }
            Access::DictOf => raw::instance_dict(parent),
            Access::TypeOf => Some(parent.get_type().into_any()),
            Access::LenOf => {
                let n = parent.len().ok()?;
                Some(PyInt::new(py, n as u64).into_any())
            }
            Access::SetItem(i) => {
                if let Ok(s) = parent.cast_exact::<PySet>() {
                    return s.iter().nth(*i);
                }
                if let Some(d) = positional_dict(parent) {
                    // the `i`-th key, in insertion order (no Python code runs)
                    return d.iter().nth(*i).map(|(k, _)| k);
                }
                let s = parent.cast_exact::<PyFrozenSet>().ok()?;
                s.iter().nth(*i)
            }
            Access::DictValue(i) => positional_dict(parent)?.iter().nth(*i).map(|(_, v)| v),
            Access::DictItem(key) => parent
                .cast::<PyDict>()
                .ok()?
                .get_item(key.bind(py))
                .ok()
                .flatten(),
            Access::TensorSize(d) => {
                let v = crate::tensor::size_or_stride(parent, *d, false)?;
                Some(PyInt::new(py, v).into_any())
            }
            Access::TensorStride(d) => {
                let v = crate::tensor::size_or_stride(parent, *d, true)?;
                Some(PyInt::new(py, v).into_any())
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{quote, AccessKey};

    #[test]
    fn sources() {
        let l = AccessKey::Local(0, "x".into()).source("", "");
        assert_eq!(l, "L['x']");
        assert_eq!(
            AccessKey::Global("it's".into()).source("", ""),
            "G['it\\'s']"
        );
        assert_eq!(AccessKey::Attr("w".into()).source(&l, ""), "L['x'].w");
        assert_eq!(
            AccessKey::Item("str:'k'".into()).source(&l, "'k'"),
            "L['x']['k']"
        );
        assert_eq!(
            AccessKey::TensorSize(-1).source(&l, ""),
            "L['x'].size()[-1]"
        );
        assert_eq!(
            AccessKey::TensorStride(2).source(&l, ""),
            "L['x'].stride()[2]"
        );
        assert_eq!(AccessKey::TypeOf.source(&l, ""), "type(L['x'])");
        assert_eq!(AccessKey::LenOf.source(&l, ""), "len(L['x'])");
        assert_eq!(AccessKey::SetItem(2).source(&l, ""), "list(L['x'])[2]");
        assert_eq!(
            AccessKey::DictValue(1).source(&l, ""),
            "list(L['x'].values())[1]"
        );
        assert_eq!(AccessKey::DictOf.source(&l, ""), "L['x'].__dict__");
        assert_eq!(AccessKey::Closure(1).source("", &quote("c")), "C['c']");
    }
}
