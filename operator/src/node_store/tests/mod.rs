//! Tests of the stores: the exact Kubernetes request sequence ([`sequence`]), the
//! publishing invariant under concurrent allocation on both backends ([`invariant`]), and
//! the updates of what others own ([`update`]).

mod apiserver;
mod etcd_conflict;
mod harness;
mod invariant;
mod sequence;
mod update;
