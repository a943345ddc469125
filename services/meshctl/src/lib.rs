//! `meshctl` as a library: its command line only ([`cli`]), so that a command line can be
//! checked against `meshctl`'s own parser (the deploy checks do, for the manifests' exec
//! probes). Everything else is the binary's.

pub mod cli;
