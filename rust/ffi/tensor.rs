//! Raw reads of torch tensor objects (`THPVariable` -> `TensorImpl`), verified at import.
