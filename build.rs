// Emits pyo3's cfgs (`Py_3_11`, `Py_3_12`, ...) for the interpreter being built against; only
// `rust/ffi/` may use them.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
