//! The tensor-match leaf: exact Python type, dtype, device, requires_grad, ndim, dispatch key
//! set, and sizes/strides at every static dimension. Plain tensors are compared on raw fields
//! (no Python calls); anything the raw read cannot vouch for goes through the Python API.
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::{plain_read, torch, Torch};
use crate::error::{Error, Result};
use crate::ffi::tensor::{check_expect, Expect};
use crate::guards::{type_name, IdRef};

/// Dimensions compared from inline arrays (no pointer chase on the hot path); more go through
/// the `sizes`/`strides` vectors.
const INLINE_DIMS: usize = 8;

/// What the direct check reads, kept together in this order (`repr(C)` only for that: it
/// mirrors no foreign struct).
#[repr(C)]
struct Hot {
    /// The exact type (kept alive by `TensorSpec::typ`, so pointer identity is exact).
    type_ptr: usize,
    keys: u64,
    non_plain_keys: u64,
    dtype: u16,
    device: [u8; 3],
    /// dtype/device above are valid (the example itself could be read directly).
    has_raw: bool,
    requires_grad: bool,
    size_mask: u8,
    stride_mask: u8,
    ndim: usize,
    /// (size, stride) of the first `min(ndim, INLINE_DIMS)` dimensions.
    dims: [[i64; 2]; INLINE_DIMS],
}

pub struct TensorSpec {
    /// The packed compare for plain tensors of up to 5 dims (None: `hot` decides).
    expect: Option<Expect>,
    hot: Hot,
    typ: IdRef,
    type_name: String,
    dtype: Py<PyAny>,
    device: Py<PyAny>,
    device_str: String,
    requires_grad: bool,
    keys: u64,
    sizes: Vec<Option<i64>>,
    strides: Vec<Option<i64>>,
}

fn opt_list(xs: &[Option<i64>]) -> String {
    let parts: Vec<String> = xs
        .iter()
        .map(|x| x.map(|v| v.to_string()).unwrap_or_else(|| "None".into()))
        .collect();
    format!("[{}]", parts.join(", "))
}

impl TensorSpec {
    pub fn new(
        example: &Bound<'_, PyAny>,
        dynamic_dims: &[i64],
        check_strides: bool,
    ) -> Result<TensorSpec> {
        let py = example.py();
        let tc = torch(py)?;
        if !tc.is_tensor(example) {
            return Err(Error::Type(format!(
                "tensor_match() needs a torch.Tensor example, got {}",
                type_name(example)
            )));
        }
        let sizes: Vec<i64> = example.call_method0("size")?.extract().map_err(|_| {
            Error::Value(
                "tensor_match() needs an example with concrete (non-symbolic) sizes".into(),
            )
        })?;
        let strides: Vec<i64> =
            match example.call_method0("stride").and_then(|s| s.extract()) {
                Ok(s) => s,
                Err(_) if !check_strides => vec![0; sizes.len()],
                Err(_) => return Err(Error::Value(
                    "tensor_match() cannot read the example's strides; pass check_strides=False"
                        .into(),
                )),
            };
        let n = sizes.len() as i64;
        let mut dynamic = vec![false; sizes.len()];
        for &d in dynamic_dims {
            let j = if d < 0 { d + n } else { d };
            if !(0..n).contains(&j) {
                return Err(Error::Value(format!(
                    "dynamic dim {d} out of range for a {n}-d example"
                )));
            }
            dynamic[j as usize] = true;
        }
        let device = example.getattr("device")?;
        let raw = plain_read(example, tc.cal.non_plain_keys).map(|r| (r.dtype, r.device));
        let (mut dims, mut size_mask, mut stride_mask) = ([[0i64; 2]; INLINE_DIMS], 0u8, 0u8);
        for i in 0..sizes.len().min(INLINE_DIMS) {
            dims[i] = [sizes[i], strides[i]];
            if !dynamic[i] {
                size_mask |= 1 << i;
                if check_strides {
                    stride_mask |= 1 << i;
                }
            }
        }
        let requires_grad: bool = example.getattr("requires_grad")?.extract()?;
        let keys = tc.keys_py(example)?;
        let (dtype_raw, device_raw) = raw.unwrap_or((0, [0; 3]));
        let size_opts: Vec<Option<i64>> = sizes
            .iter()
            .zip(&dynamic)
            .map(|(&s, &d)| (!d).then_some(s))
            .collect();
        let stride_opts: Vec<Option<i64>> = strides
            .iter()
            .zip(&dynamic)
            .map(|(&s, &d)| (!d && check_strides).then_some(s))
            .collect();
        let expect = Expect::new(
            example,
            &size_opts,
            &stride_opts,
            requires_grad,
            keys,
            tc.cal.non_plain_keys,
        )
        .filter(|_| raw.is_some());
        Ok(TensorSpec {
            expect,
            hot: Hot {
                type_ptr: example.get_type_ptr() as usize,
                keys,
                non_plain_keys: tc.cal.non_plain_keys,
                dtype: dtype_raw,
                device: device_raw,
                has_raw: raw.is_some(),
                requires_grad,
                size_mask,
                stride_mask,
                ndim: sizes.len(),
                dims,
            },
            typ: IdRef::strong(example.get_type().as_any()),
            type_name: example.get_type().name()?.to_string(),
            dtype: example.getattr("dtype")?.unbind(),
            device_str: device.str()?.to_string(),
            device: device.unbind(),
            requires_grad,
            keys,
            sizes: size_opts,
            strides: stride_opts,
        })
    }

    pub fn describe(&self, source: &str) -> String {
        format!(
            "tensor_match({source}: {}, {}, device={}, requires_grad={}, size={}, stride={})",
            self.type_name,
            self.dtype_str(),
            self.device_str,
            if self.requires_grad { "True" } else { "False" },
            opt_list(&self.sizes),
            opt_list(&self.strides)
        )
    }

    fn dtype_str(&self) -> String {
        Python::attach(|py| {
            self.dtype
                .bind(py)
                .str()
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
    }

    /// The packed compare of plain tensors, when this leaf has one.
    #[inline]
    pub fn expect(&self) -> Option<&Expect> {
        self.expect.as_ref()
    }

    /// The check decided from raw reads alone (no Python call, no allocation): None when only
    /// the Python API can decide (a tensor subclass, a view's autograd metadata, ...).
    #[inline]
    pub fn check_raw(&self, v: &Bound<'_, PyAny>) -> Option<bool> {
        if let Some(e) = &self.expect {
            if let Some(ok) = check_expect(v, e) {
                return Some(ok);
            }
        }
        let h = &self.hot;
        if v.get_type_ptr() as usize != h.type_ptr {
            return Some(false);
        }
        if !h.has_raw {
            return None;
        }
        let r = plain_read(v, h.non_plain_keys)?;
        if r.keys != h.keys || r.dtype != h.dtype || r.device != h.device || r.sizes.len() != h.ndim
        {
            return Some(false);
        }
        if h.ndim <= INLINE_DIMS {
            for i in 0..h.ndim {
                let [size, stride] = h.dims[i];
                if ((h.size_mask >> i) & 1 != 0 && r.sizes[i] != size)
                    || ((h.stride_mask >> i) & 1 != 0 && r.strides[i] != stride)
                {
                    return Some(false);
                }
            }
        } else if !dims_match(&self.sizes, r.sizes) || !dims_match(&self.strides, r.strides) {
            return Some(false);
        }
        r.requires_grad.map(|rg| rg == h.requires_grad)
    }

    /// The hot path. Never raises.
    #[inline]
    pub fn check(&self, v: &Bound<'_, PyAny>) -> bool {
        if let Some(e) = &self.expect {
            if let Some(ok) = check_expect(v, e) {
                return ok;
            }
        }
        let h = &self.hot;
        if v.get_type_ptr() as usize != h.type_ptr {
            return false;
        }
        if h.has_raw {
            if let Some(r) = plain_read(v, h.non_plain_keys) {
                if r.keys != h.keys
                    || r.dtype != h.dtype
                    || r.device != h.device
                    || r.sizes.len() != h.ndim
                {
                    return false;
                }
                if h.ndim <= INLINE_DIMS {
                    for i in 0..h.ndim {
                        let [size, stride] = h.dims[i];
                        if ((h.size_mask >> i) & 1 != 0 && r.sizes[i] != size)
                            || ((h.stride_mask >> i) & 1 != 0 && r.strides[i] != stride)
                        {
                            return false;
                        }
                    }
                } else if !dims_match(&self.sizes, r.sizes) || !dims_match(&self.strides, r.strides)
                {
                    return false;
                }
                return match r.requires_grad {
                    Some(rg) => rg == h.requires_grad,
                    None => {
                        let py = v.py();
                        v.getattr(pyo3::intern!(py, "requires_grad"))
                            .and_then(|x| x.extract::<bool>())
                            .ok()
                            == Some(h.requires_grad)
                    }
                };
            }
        }
        let Ok(tc) = torch(v.py()) else { return false };
        self.first_mismatch(tc, v)
            .map(|m| m.is_none())
            .unwrap_or(false)
    }

    /// The Python-API comparison: None if everything matches, else (what, expected, got).
    fn first_mismatch(
        &self,
        tc: &Torch,
        v: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(String, String, String)>> {
        let py = v.py();
        let s = |x: &Bound<'_, PyAny>| x.str().map(|s| s.to_string()).unwrap_or_default();
        let dtype = v.getattr("dtype")?;
        if !dtype.is(self.dtype.bind(py)) {
            return Ok(Some((".dtype".into(), s(self.dtype.bind(py)), s(&dtype))));
        }
        let device = v.getattr("device")?;
        if !device.eq(self.device.bind(py))? {
            return Ok(Some((
                ".device".into(),
                self.device_str.clone(),
                s(&device),
            )));
        }
        let rg: bool = v.getattr("requires_grad")?.extract()?;
        if rg != self.requires_grad {
            let b = |x: bool| if x { "True" } else { "False" }.to_string();
            return Ok(Some((
                ".requires_grad".into(),
                b(self.requires_grad),
                b(rg),
            )));
        }
        let sizes = v.call_method0("size")?.cast_into::<PyTuple>()?;
        if sizes.len() != self.sizes.len() {
            return Ok(Some((
                ".dim()".into(),
                self.sizes.len().to_string(),
                sizes.len().to_string(),
            )));
        }
        let strides = v.call_method0("stride")?.cast_into::<PyTuple>()?;
        for (what, want, got) in [
            ("size", &self.sizes, &sizes),
            ("stride", &self.strides, &strides),
        ] {
            for (i, w) in want.iter().enumerate() {
                if let Some(w) = w {
                    let g = got.get_item(i)?;
                    if g.extract::<i64>().ok() != Some(*w) {
                        return Ok(Some((format!(".{what}()[{i}]"), w.to_string(), s(&g))));
                    }
                }
            }
        }
        let keys = tc.keys_py(v)?;
        if keys != self.keys {
            let show = |k: u64| -> String {
                let ks = py
                    .import("torch")
                    .and_then(|t| {
                        t.getattr("_C")?
                            .getattr("DispatchKeySet")?
                            .call_method1("from_raw_repr", (k,))
                    })
                    .map(|x| s(&x))
                    .unwrap_or_else(|_| format!("{k:#x}"));
                ks
            };
            return Ok(Some((" dispatch keys".into(), show(self.keys), show(keys))));
        }
        Ok(None)
    }

    /// Why `v` fails this leaf (after `check` returned false).
    pub fn explain(&self, v: &Bound<'_, PyAny>, source: &str) -> String {
        let py = v.py();
        if !self
            .typ
            .is(py, v.get_type_ptr() as *mut pyo3::ffi::PyObject)
        {
            return format!(
                "type({source}) is {} (got {})",
                self.type_name,
                type_name(v)
            );
        }
        let found = torch(py).and_then(|tc| self.first_mismatch(tc, v));
        drop(PyErr::take(py));
        match found {
            Ok(Some((what, want, got))) => format!("{source}{what} == {want} (got {got})"),
            Ok(None) => format!(
                "{} (the tensor changed while it was checked)",
                self.describe(source)
            ),
            Err(e) => format!("{} (reading it raised {})", self.describe(source), e),
        }
    }
}

#[inline]
fn dims_match(want: &[Option<i64>], got: &[i64]) -> bool {
    want.iter().zip(got).all(|(w, g)| w.is_none_or(|w| w == *g))
}

#[cfg(test)]
mod tests {
    use super::{dims_match, opt_list};

    #[test]
    fn dims() {
        assert!(dims_match(&[Some(2), None, Some(4)], &[2, 99, 4]));
        assert!(!dims_match(&[Some(2), None, Some(4)], &[2, 99, 5]));
        assert!(dims_match(&[], &[]));
        assert_eq!(opt_list(&[Some(3), None]), "[3, None]");
    }
}
