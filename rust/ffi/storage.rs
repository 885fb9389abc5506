//! Raw reads of a tensor's storage identity and storage offset, for the aliasing guard leaf
//! (`crate::guards::aliasing`).
//!
//! Structures read (c10/core/TensorImpl.h): `TensorImpl::storage_` (a `c10::Storage`, one
//! `intrusive_ptr<StorageImpl>`: the `StorageImpl*` that `untyped_storage()._cdata` returns)
//! and `TensorImpl::storage_offset_` (the word after `sizes_and_strides_`, located by
//! `crate::tensor::calibrate`). The offset of `storage_` is never hard-coded: the aliasing
//! module finds it on sample tensors and verifies it against the Python API before use; until
//! then (or for tensors with custom size/stride policies) callers take the Python path.
#![allow(unsafe_code)]

use pyo3::prelude::*;

use super::tensor::{impl_bytes, layout, read_tensor, IMPL_SCAN};

/// Bytes after `sizes_and_strides_` at which `storage_offset_` sits (verified by calibration:
/// 8 words of inline sizes/strides after the size word, then 1 + 10 words in all = 88).
const STORAGE_OFFSET_AFTER_SIZES: usize = 88;

/// A bounded copy of the first `IMPL_SCAN` bytes of the TensorImpl of `t`, whose address
/// torch reports as `expect_impl` (`t._cdata`); None if direct reads are not enabled.
pub fn impl_prefix(t: &Bound<'_, PyAny>, expect_impl: usize) -> Option<Vec<u8>> {
    let l = layout()?;
    impl_bytes(t, l.tensor_base, l.cdata, expect_impl, IMPL_SCAN)
}

/// `(StorageImpl*, storage_offset)` of a plain tensor read directly, with `storage_at` the
/// verified offset of `storage_` in TensorImpl. None: not a tensor, reads not enabled, or a
/// tensor whose sizes/strides/storage are answered by custom code.
#[inline]
pub fn read_storage(obj: &Bound<'_, PyAny>, storage_at: usize) -> Option<(usize, i64)> {
    let raw = read_tensor(obj)?; // type check, layout installed
    if raw.policy != 0 || storage_at + 8 > IMPL_SCAN {
        return None;
    }
    let l = layout()?;
    // SAFETY: `obj` is a THPVariable (read_tensor checked it) holding a live TensorImpl at the
    // verified `cdata` offset; `storage_at` (< IMPL_SCAN) was verified by the caller against
    // `untyped_storage()._cdata` on sample tensors, and `sizes_strides + 88` by calibration
    // against `storage_offset()`; both words lie inside the TensorImpl.
    unsafe {
        let imp = *((obj.as_ptr() as *const u8).add(l.cdata) as *const *const u8);
        if imp.is_null() {
            return None;
        }
        let storage = *(imp.add(storage_at) as *const usize);
        let offset = *(imp.add(l.sizes_strides + STORAGE_OFFSET_AFTER_SIZES) as *const i64);
        Some((storage, offset))
    }
}
