//! Two-step confirmation for tools whose effect class is notify, wake, alert or delete.

pub mod pending;
