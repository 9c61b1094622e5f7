//! Counting calls in flight, so shutdown can stop taking new ones, let the
//! ones already running finish, and only then release the bus name.

use airlock_proto::{Code, Error};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct State {
    closed: bool,
    running: usize,
}

/// The in-flight counter and its door.
#[derive(Debug)]
pub struct InFlight {
    state: watch::Sender<State>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            state: watch::Sender::new(State::default()),
        }
    }
}

/// One admitted call; dropping it (reply sent or not) lets shutdown proceed.
#[derive(Debug)]
pub struct CallGuard<'a> {
    owner: &'a InFlight,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.owner.state.send_modify(|s| s.running -= 1);
    }
}

impl InFlight {
    /// Admits a call, or refuses it (`RUNTIME_UNAVAILABLE`) once shutdown
    /// has begun: the caller gets an answer and may retry against the next
    /// instance; nothing is half done.
    pub fn enter(&self) -> Result<CallGuard<'_>, Error> {
        let mut admitted = false;
        self.state.send_if_modified(|s| {
            if s.closed {
                false
            } else {
                s.running += 1;
                admitted = true;
                true
            }
        });
        if admitted {
            Ok(CallGuard { owner: self })
        } else {
            Err(Error::with(
                Code::RUNTIME_UNAVAILABLE,
                "the supervisor is shutting down; retry shortly",
            ))
        }
    }

    /// Stops admitting calls.
    pub fn close(&self) {
        self.state.send_modify(|s| s.closed = true);
    }

    /// Calls running now.
    pub fn running(&self) -> usize {
        self.state.borrow().running
    }

    /// Waits until no admitted call is running, at most `timeout`. True
    /// when drained.
    pub async fn drained(&self, timeout: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.running == 0))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn close_refuses_new_calls_and_waits_for_running_ones() {
        let f = std::sync::Arc::new(InFlight::default());
        let g = f.enter().unwrap();
        assert_eq!(f.running(), 1);
        f.close();
        assert_eq!(f.enter().unwrap_err().code, Code::RUNTIME_UNAVAILABLE);
        assert!(!f.drained(Duration::from_millis(20)).await);
        let f2 = f.clone();
        let waiter = tokio::spawn(async move { f2.drained(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(g);
        assert!(waiter.await.unwrap());
        assert_eq!(f.running(), 0);
    }
}
