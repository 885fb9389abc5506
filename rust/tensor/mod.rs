//! Tensor metadata for guards: direct reads of sizes, strides, dtype, device, requires_grad and
//! dispatch keys through the layout that `calibrate` located and verified (see
//! `crate::ffi::tensor`), with the Python API as the always-correct fallback.
//!
//! Files: `calibrate` (finding and verifying the layout), `spec` (the tensor-match leaf),
//! `samples.py` (the sample tensors calibration uses, embedded). Python entry points:
//! `tensor_fast_path()`, `tensor_metadata(t)`.
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};

use crate::ffi::tensor::{self as raw, TensorRaw};

mod calibrate;
mod spec;

pub use spec::TensorSpec;

/// Torch handles and calibration results, set up on first use (torch imported then).
pub(crate) struct Torch {
    pub cal: calibrate::Calibration,
    pub tensor_base: Py<PyAny>,
    pub dispatch_keys: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

pub(crate) fn torch(py: Python<'_>) -> PyResult<&Torch> {
    TORCH.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let c = torch.getattr("_C")?;
        Ok(Torch {
            cal: calibrate::calibrate(py),
            tensor_base: c.getattr("TensorBase")?.unbind(),
            dispatch_keys: c.getattr("_dispatch_keys")?.unbind(),
        })
    })
}

impl Torch {
    pub(crate) fn fast(&self) -> bool {
        self.cal.layout.is_some()
    }

    pub(crate) fn dtype_of<'py>(&self, py: Python<'py>, code: u16) -> Option<Bound<'py, PyAny>> {
        self.cal
            .dtypes
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, d)| d.bind(py).clone())
    }

    pub(crate) fn device_type_of(&self, code: u8) -> Option<&str> {
        self.cal
            .device_types
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, n)| n.as_str())
    }

    pub(crate) fn is_tensor(&self, v: &Bound<'_, PyAny>) -> bool {
        v.is_instance(self.tensor_base.bind(v.py()))
            .unwrap_or(false)
    }

    pub(crate) fn keys_py(&self, v: &Bound<'_, PyAny>) -> PyResult<u64> {
        self.dispatch_keys
            .bind(v.py())
            .call1((v,))?
            .call_method0("raw_repr")?
            .extract()
    }
}

/// A direct read that is trustworthy for sizes/strides (plain storage, no custom policy, no
/// Python-level keys), if the layout was verified.
#[inline]
pub(crate) fn plain_read<'a>(
    v: &'a Bound<'_, PyAny>,
    non_plain_keys: u64,
) -> Option<TensorRaw<'a>> {
    let r = raw::read_tensor(v)?;
    if r.policy != 0 || r.keys & non_plain_keys != 0 {
        return None;
    }
    Some(r)
}

fn norm_dim(d: i64, n: usize) -> Option<usize> {
    let n = n as i64;
    let j = if d < 0 { d + n } else { d };
    (0..n).contains(&j).then_some(j as usize)
}

/// Sizes (at 0..n) and strides (at 8..8+n) of a plain tensor of up to 8 dims copied into
/// `out`, read directly (no autograd metadata, no Python call); its n, or None.
#[inline]
pub(crate) fn dims_into(v: &Bound<'_, PyAny>, out: &mut [i64; 16]) -> Option<usize> {
    let t = torch(v.py()).ok()?;
    let (sizes, strides) = raw::read_dims(v, t.cal.non_plain_keys)?;
    let n = sizes.len();
    if n > 8 {
        return None;
    }
    out[..n].copy_from_slice(sizes);
    out[8..8 + n].copy_from_slice(strides);
    Some(n)
}

/// `dim` (negative from the end) as an index into `n` dimensions.
#[inline]
pub(crate) fn dim_index(dim: i64, n: usize) -> Option<usize> {
    norm_dim(dim, n)
}

/// `v.size()[dim]` (or `v.stride()[dim]`) read directly from a plain tensor, without its
/// autograd metadata or any Python call; None when only the Python API can answer.
#[inline]
pub(crate) fn size_or_stride_raw(v: &Bound<'_, PyAny>, dim: i64, stride: bool) -> Option<i64> {
    let t = torch(v.py()).ok()?;
    let (sizes, strides) = raw::read_dims(v, t.cal.non_plain_keys)?;
    let xs = if stride { strides } else { sizes };
    norm_dim(dim, xs.len()).map(|j| xs[j])
}

/// `v.size()[dim]` (or `v.stride()[dim]`) as an i64: read directly for plain tensors, through
/// the Python API for other tensors, None for non-tensors, symbolic values or a bad dim.
pub(crate) fn size_or_stride(v: &Bound<'_, PyAny>, dim: i64, stride: bool) -> Option<i64> {
    if let Some(x) = size_or_stride_raw(v, dim, stride) {
        return Some(x);
    }
    let t = torch(v.py()).ok()?;
    if let Some(r) = plain_read(v, t.cal.non_plain_keys) {
        let xs = if stride { r.strides } else { r.sizes };
        return norm_dim(dim, xs.len()).map(|j| xs[j]);
    }
    if !t.is_tensor(v) {
        return None;
    }
    let xs = v
        .call_method0(if stride { "stride" } else { "size" })
        .ok()?;
    let xs = xs.cast_into::<PyTuple>().ok()?;
    let j = norm_dim(dim, xs.len())?;
    xs.get_item(j).ok()?.extract::<i64>().ok()
}

#[pyfunction]
fn tensor_fast_path(py: Python<'_>) -> PyResult<bool> {
    Ok(torch(py)?.fast())
}

/// Why the fast path is off (None when it is on): for diagnostics and tests.
#[pyfunction]
fn _tensor_fast_path_failure(py: Python<'_>) -> PyResult<Option<String>> {
    Ok(torch(py)?.cal.failure.clone())
}

/// The verified layout as {field: byte offset} (None when the fast path is off): for the layout
/// tests, which cross-check it against the torch headers and raw memory.
#[pyfunction]
fn _tensor_layout<'py>(py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some(l) = torch(py)?.cal.layout else {
        return Ok(None);
    };
    let d = PyDict::new(py);
    for (k, v) in [
        ("cdata", l.cdata),
        ("autograd_meta", l.autograd_meta),
        ("sizes_strides", l.sizes_strides),
        ("dtype", l.dtype),
        ("device", l.device),
        ("flags", l.flags),
        ("flags_len", l.flags_len),
        ("keys", l.keys),
        ("am_grad_fn", l.am_grad_fn),
        ("am_requires_grad", l.am_requires_grad),
        ("view_base", l.view_base),
        ("view_engaged", l.view_engaged),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("policy_mask", l.policy_mask)?;
    Ok(Some(d))
}

#[pyfunction]
fn tensor_metadata<'py>(py: Python<'py>, t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let tc = torch(py)?;
    if !tc.is_tensor(t) {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "tensor_metadata() needs a torch.Tensor, got {}",
            crate::guards::type_name(t)
        )));
    }
    let d = PyDict::new(py);
    if let Some(r) = plain_read(t, tc.cal.non_plain_keys) {
        let dtype = tc.dtype_of(py, r.dtype);
        let dev = tc.device_type_of(r.device[0]);
        if let (Some(dtype), Some(dev), Some(rg)) = (dtype, dev, r.requires_grad) {
            d.set_item("sizes", PyTuple::new(py, r.sizes)?)?;
            d.set_item("strides", PyTuple::new(py, r.strides)?)?;
            d.set_item("dtype", dtype)?;
            d.set_item("device_type", dev)?;
            d.set_item("device_index", r.device[1] as i8 as i64)?;
            d.set_item("requires_grad", rg)?;
            d.set_item("dispatch_keys", r.keys)?;
            d.set_item("fast", true)?;
            return Ok(d);
        }
    }
    let device = t.getattr("device")?;
    let index = device.getattr("index")?;
    d.set_item(
        "sizes",
        t.call_method0("size")?
            .extract::<Vec<i64>>()
            .map(|v| PyTuple::new(py, v))??,
    )?;
    d.set_item(
        "strides",
        t.call_method0("stride")?
            .extract::<Vec<i64>>()
            .map(|v| PyTuple::new(py, v))??,
    )?;
    d.set_item("dtype", t.getattr("dtype")?)?;
    d.set_item("device_type", device.getattr("type")?)?;
    d.set_item(
        "device_index",
        if index.is_none() {
            -1
        } else {
            index.extract::<i64>()?
        },
    )?;
    d.set_item("requires_grad", t.getattr("requires_grad")?)?;
    d.set_item("dispatch_keys", tc.keys_py(t)?)?;
    d.set_item("fast", false)?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(tensor_fast_path, m)?)?;
    m.add_function(wrap_pyfunction!(_tensor_fast_path_failure, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_metadata, m)?)?;
    m.add_function(wrap_pyfunction!(_tensor_layout, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::norm_dim;

    #[test]
    fn dims() {
        assert_eq!(norm_dim(0, 3), Some(0));
        assert_eq!(norm_dim(-1, 3), Some(2));
        assert_eq!(norm_dim(-3, 3), Some(0));
        assert_eq!(norm_dim(3, 3), None);
        assert_eq!(norm_dim(-4, 3), None);
        assert_eq!(norm_dim(0, 0), None);
    }
}
