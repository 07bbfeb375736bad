//! Runtime guards that the gate consults on every call (no MCP knowledge).

#![forbid(unsafe_code)]
