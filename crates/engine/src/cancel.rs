//! A flag that stops a running generation at its next cycle (a server's client went away, or a
//! stop string matched): shared between the decoding thread and whoever may ask it to stop. It
//! does not know what a cycle is; the decode loops check it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Cloned handles share one flag; the default is a fresh flag nobody has raised.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Asks the generation to stop after the token or cycle it is in.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::cancel`] was called on any clone.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_sees_the_cancel_of_another() {
        let a = Cancel::default();
        let b = a.clone();
        assert!(!b.is_cancelled());
        a.cancel();
        assert!(b.is_cancelled());
        assert!(!Cancel::default().is_cancelled());
    }
}
