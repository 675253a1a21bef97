//! `ServerReady` / `ModelReady`: ready while every teacher reports ready
//! (the same probe that drives gRPC health, see `super::super::watch_teachers`).
//! `ServerLive` is always true while the process answers.

use crate::server::App;
use std::sync::atomic::Ordering;

/// Whether the last teacher probe found every teacher ready.
pub fn ready(app: &App) -> bool {
    app.ready.load(Ordering::Relaxed)
}
