//! Unit tests on hand-written renderings: a small one that holds (the control), and the
//! same broken one way at a time, each break found (the negative controls).

mod checks;
mod fixture;
mod parts;
