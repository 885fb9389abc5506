//! Constants for `equals` leaves: None, bool, int, float, str, bytes and nested tuples of these,
//! compared with an exact type match (True is not 1, 1.0 is not 1). Floats compare bitwise, so
//! -0.0 is not 0.0 and a NaN constant matches any NaN.
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyString, PyTuple};

use crate::error::{Error, Result};

pub(crate) enum Const {
    None,
    Bool(bool),
    Int(i64),
    /// Ints outside i64, compared with int's own `==` (no user code involved).
    BigInt(Py<PyAny>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Const>),
}

impl Const {
    pub(crate) fn from_py(v: &Bound<'_, PyAny>) -> Result<Const> {
        if v.is_none() {
            Ok(Const::None)
        } else if v.is_exact_instance_of::<PyBool>() {
            Ok(Const::Bool(v.is_truthy()?))
        } else if v.is_exact_instance_of::<PyInt>() {
            Ok(match v.extract::<i64>() {
                Ok(i) => Const::Int(i),
                Err(_) => Const::BigInt(v.clone().unbind()),
            })
        } else if v.is_exact_instance_of::<PyFloat>() {
            Ok(Const::Float(v.extract::<f64>()?))
        } else if let Ok(s) = v.cast_exact::<PyString>() {
            Ok(Const::Str(s.to_str()?.to_owned()))
        } else if let Ok(b) = v.cast_exact::<PyBytes>() {
            Ok(Const::Bytes(b.as_bytes().to_vec()))
        } else if let Ok(t) = v.cast_exact::<PyTuple>() {
            let items = t
                .iter()
                .map(|x| Const::from_py(&x))
                .collect::<Result<Vec<_>>>()?;
            Ok(Const::Tuple(items))
        } else {
            let r = v
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "<unprintable>".into());
            let t = v
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            Err(Error::Type(format!(
                "equals() takes None, bool, int, float, str, bytes or tuples of these; got {r} of type {t}"
            )))
        }
    }

    /// True if `v` has exactly this constant's type and value.
    pub(crate) fn matches(&self, v: &Bound<'_, PyAny>) -> bool {
        match self {
            Const::None => v.is_none(),
            Const::Bool(b) => v.is_exact_instance_of::<PyBool>() && v.is_truthy().ok() == Some(*b),
            Const::Int(i) => {
                v.is_exact_instance_of::<PyInt>() && v.extract::<i64>().ok() == Some(*i)
            }
            Const::BigInt(o) => {
                v.is_exact_instance_of::<PyInt>() && v.eq(o.bind(v.py())).unwrap_or(false)
            }
            Const::Float(f) => {
                v.is_exact_instance_of::<PyFloat>()
                    && match v.extract::<f64>() {
                        Ok(x) => float_same(*f, x),
                        Err(_) => false,
                    }
            }
            Const::Str(s) => match v.cast_exact::<PyString>() {
                Ok(p) => p.to_str().map(|x| x == s).unwrap_or(false),
                Err(_) => false,
            },
            Const::Bytes(b) => match v.cast_exact::<PyBytes>() {
                Ok(p) => p.as_bytes() == b.as_slice(),
                Err(_) => false,
            },
            Const::Tuple(items) => match v.cast_exact::<PyTuple>() {
                Ok(t) => {
                    t.len() == items.len() && items.iter().zip(t.iter()).all(|(c, x)| c.matches(&x))
                }
                Err(_) => false,
            },
        }
    }
}

/// Float equality for guards: NaN matches NaN, otherwise bitwise (so -0.0 != 0.0).
pub(crate) fn float_same(expected: f64, got: f64) -> bool {
    if expected.is_nan() {
        got.is_nan()
    } else {
        expected.to_bits() == got.to_bits()
    }
}

/// Whether `v` is cheap and safe to show in an explanation (a constant-like builtin value).
pub(crate) fn is_showable(v: &Bound<'_, PyAny>) -> bool {
    if let Ok(t) = v.cast_exact::<PyTuple>() {
        return t.len() <= 16 && t.iter().all(|x| is_showable(&x));
    }
    v.is_none()
        || v.is_exact_instance_of::<PyBool>()
        || v.is_exact_instance_of::<PyInt>()
        || v.is_exact_instance_of::<PyFloat>()
        || v.is_exact_instance_of::<PyString>()
        || v.is_exact_instance_of::<PyBytes>()
}

#[cfg(test)]
mod tests {
    use super::float_same;

    #[test]
    fn floats() {
        assert!(float_same(f64::NAN, f64::NAN));
        assert!(!float_same(0.0, -0.0));
        assert!(float_same(1.5, 1.5));
        assert!(!float_same(1.5, f64::NAN));
    }
}
