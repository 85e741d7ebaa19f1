//! The server's open connections and which may be closed to make room for a new one. A
//! connection waiting for a request head (new, or idle between requests) is evictable; one with a
//! request in flight (from the moment its handler is called until its response body is written
//! out) never is. At the cap, the connection that has waited longest for a head goes first, so a
//! crowd of clients that connect and send nothing, or half a head, cannot keep others out: each
//! new connection pushes the oldest of them out, and a new one itself is safe until `cap` newer
//! ones have arrived.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use hyper::body::{Frame, SizeHint};
use tokio::sync::Notify;

/// `Slot::state` once the connection is chosen for eviction: no request may start on it.
const EVICTED: usize = usize::MAX;

pub struct Connections {
    cap: usize,
    epoch: Instant,
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    /// Woken when a connection closes or stops being busy: room may have appeared.
    room: Notify,
}

struct Slot {
    id: u64,
    /// Requests in flight (0: waiting for a head), or `EVICTED`.
    state: AtomicUsize,
    /// Since when it has waited for a head, in nanoseconds after `Connections::epoch`.
    waiting_since: AtomicU64,
    evicted: Notify,
}

impl Connections {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Connections {
            cap: cap.max(1),
            epoch: Instant::now(),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            room: Notify::new(),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn open(&self) -> MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        // A panic while the map is held leaves it whole (no step of ours can half-update it).
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a new connection could be taken now: below the cap, or one evictable.
    pub fn has_room(&self) -> bool {
        let open = self.open();
        open.len() < self.cap || open.values().any(|s| s.state.load(Ordering::Acquire) == 0)
    }

    /// Resolves when a connection has closed or finished a request since the last call.
    pub async fn room_changed(&self) {
        self.room.notified().await;
    }

    /// Take a new connection: below the cap at once; at the cap in the place of the connection
    /// that has waited longest for a head, which is told to close. `None` when every open
    /// connection has a request in flight.
    pub fn admit(self: &Arc<Self>) -> Option<Connection> {
        let mut open = self.open();
        while open.len() >= self.cap {
            let oldest = open
                .values()
                .filter(|s| s.state.load(Ordering::Acquire) == 0)
                .min_by_key(|s| (s.waiting_since.load(Ordering::Acquire), s.id))?
                .clone();
            // A request may have begun on it since the look: then look again.
            if oldest.state.compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                open.remove(&oldest.id);
                oldest.evicted.notify_one();
                tracing::debug!(
                    event = "relay.api.connection_evicted",
                    "closed the connection longest without a request to make room"
                );
            }
        }
        let slot = Arc::new(Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            state: AtomicUsize::new(0),
            waiting_since: AtomicU64::new(self.now()),
            evicted: Notify::new(),
        });
        open.insert(slot.id, slot.clone());
        Some(Connection(Tracker { all: self.clone(), slot }))
    }

    /// Open connections (evicted ones leave at once, before their socket is closed).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.open().len()
    }
}

/// One open connection, owned by its task; dropping it frees its place.
pub struct Connection(Tracker);

impl Connection {
    pub fn tracker(&self) -> Tracker {
        self.0.clone()
    }

    /// Resolves when the connection has been chosen for eviction: drop it then.
    pub async fn evicted(&self) {
        self.0.slot.evicted.notified().await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.all.open().remove(&self.0.slot.id);
        self.0.all.room.notify_one();
    }
}

/// What a connection's service holds to mark its requests in flight.
#[derive(Clone)]
pub struct Tracker {
    all: Arc<Connections>,
    slot: Arc<Slot>,
}

impl Tracker {
    /// A request has begun (its head is read): the connection is not evictable until the
    /// returned guard drops. `None` if it was evicted first; it is about to close.
    pub fn begin(&self) -> Option<InFlight> {
        let state = &self.slot.state;
        state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n != EVICTED).then(|| n + 1)).ok()?;
        Some(InFlight(self.clone()))
    }
}

/// A request in flight; dropped when its response body has been written out (or abandoned).
pub struct InFlight(Tracker);

impl Drop for InFlight {
    fn drop(&mut self) {
        let Tracker { all, slot } = &self.0;
        slot.waiting_since.store(all.now(), Ordering::Release);
        if slot.state.fetch_sub(1, Ordering::AcqRel) == 1 {
            all.room.notify_one();
        }
    }
}

/// A response body that keeps its request in flight until hyper has written it and dropped it.
pub struct Tracked {
    body: Body,
    /// Held, never read: its drop marks the request done.
    _in_flight: InFlight,
}

impl Tracked {
    pub fn new(body: Body, in_flight: InFlight) -> Self {
        Tracked { body, _in_flight: in_flight }
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_longest_waiting_idle_connection_makes_room_and_a_busy_one_never_does() {
        let all = Connections::new(3);
        let first = all.admit().expect("room");
        let second = all.admit().expect("room");
        let third = all.admit().expect("room");
        let busy = first.tracker().begin().expect("not evicted");
        // `first` is busy: `second` has waited longest and goes.
        let fourth = all.admit().expect("an idle one to evict");
        assert_eq!(all.len(), 3);
        assert!(second.tracker().begin().is_none(), "the evicted connection takes no request");
        // `first` finishes its request: now it waits for a head, since after `third` and `fourth`.
        drop(busy);
        let fifth = all.admit().expect("an idle one to evict");
        assert!(third.tracker().begin().is_none(), "third waited longest");
        let _b1 = first.tracker().begin().expect("first was not evicted");
        let _b4 = fourth.tracker().begin().expect("fourth was not evicted");
        let _b5 = fifth.tracker().begin().expect("fifth was not evicted");
        assert!(all.admit().is_none(), "all busy: no room");
        assert!(!all.has_room());
        drop((second, third));
        assert_eq!(all.len(), 3, "evicted ones had already left");
        drop(first);
        assert!(all.has_room());
        assert!(all.admit().is_some());
    }
}
