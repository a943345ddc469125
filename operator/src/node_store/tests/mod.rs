//! Tests of the stores: the exact Kubernetes request sequence ([`sequence`]), and the
//! publishing invariant under concurrent allocation on both backends ([`invariant`]).

mod apiserver;
mod etcd_conflict;
mod harness;
mod invariant;
mod sequence;
