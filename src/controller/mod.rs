//! The controller: observe, plan, act, one step per reconcile.
pub mod conditions;
pub mod plan;
pub mod state;
