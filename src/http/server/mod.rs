//! The hand-built HTTP server the listeners run, for the limits and costs
//! `axum::serve` does not cover (docs/design.md, "The hit path"):
//! - [`serve`]: connections through hyper, head deadline, graceful shutdown;
//! - [`front`]: the service every request meets;
//! - [`shed`]: the header limit and load shedding;
//! - [`conns`]: the cap on each listener's open connections;
//! - [`rewrite`]: hyper's own bare 400/414/431 answers as problem documents;
//! - [`bodies`]: the bound on request bodies held in memory.

pub mod bodies;
pub mod conns;
pub mod front;
pub mod rewrite;
pub mod serve;
pub mod shed;
