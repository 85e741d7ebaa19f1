//! A transaction whose BEGIN and COMMIT travel with its statements, pipelined on one
//! connection, instead of taking a round trip each: for a short transaction that runs often,
//! where round trips are most of its time (a worker's lanes: `executor::worker`). The
//! caller sends BEGIN before any statement and COMMIT after the last (futures polled together
//! send their statements in the order they are first polled); a statement that must wait for a
//! prepare goes after, so prepare the later flights' statements first.

use std::ops::Deref;

use super::{GenericClient, StoreError};

/// A pooled connection with a transaction opened by `begin`. Unless `release`d after its
/// COMMIT, the connection is closed instead of returned to the pool (an error, or the future
/// dropped), and closing it rolls the transaction back: no connection goes back to the pool
/// inside a transaction.
pub struct Pipelined(Option<deadpool_postgres::Client>);

impl Pipelined {
    pub fn new(db: deadpool_postgres::Client) -> Pipelined {
        Pipelined(Some(db))
    }

    pub async fn begin(&self) -> Result<(), StoreError> {
        Ok(self.batch_execute("BEGIN").await?)
    }

    pub async fn commit(&self) -> Result<(), StoreError> {
        Ok(self.batch_execute("COMMIT").await?)
    }

    /// Back to the pool, once `commit` has succeeded.
    pub fn release(mut self) {
        self.0.take();
    }
}

impl Deref for Pipelined {
    type Target = deadpool_postgres::Client;

    fn deref(&self) -> &deadpool_postgres::Client {
        self.0.as_ref().expect("present until released or dropped")
    }
}

impl Drop for Pipelined {
    fn drop(&mut self) {
        if let Some(db) = self.0.take() {
            // Out of the pool; dropping the connection closes it.
            drop(deadpool_postgres::Object::take(db));
        }
    }
}
