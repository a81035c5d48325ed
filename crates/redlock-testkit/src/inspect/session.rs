//! [`Session`]: one short-lived connection to a [`RedisAt`] for a step or a short sequence of
//! steps, each under the hard deadline.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use fred::prelude::{Client, ClientLike, Error as FredError};
use fred::types::CustomCommand;
use tokio::task::JoinHandle;

use super::RedisAt;
use crate::HarnessError;

/// How long a polite QUIT may take after a successful call.
const QUIT_TIMEOUT: Duration = Duration::from_millis(200);

/// One connection, closed by [`Session::close`] (QUIT) or, on an error path, by dropping it
/// (which stops fred's routing task and with it the socket).
pub(super) struct Session<'a> {
    pub(super) at: &'a RedisAt,
    pub(super) client: Client,
    task: Option<JoinHandle<Result<(), FredError>>>,
}

impl<'a> Session<'a> {
    pub(super) async fn open(at: &'a RedisAt, op: &str) -> Result<Session<'a>, HarnessError> {
        let client = at.client().map_err(|e| at.redis_error(op, e))?;
        match at.bounded(op, client.init()).await {
            Ok(task) => Ok(Session {
                at,
                client,
                task: Some(task),
            }),
            Err(e) => {
                // Close the connection task fred may still run for this client.
                let _ = tokio::time::timeout(QUIT_TIMEOUT, client.quit()).await;
                Err(e)
            }
        }
    }

    pub(super) async fn run<T>(
        &self,
        op: &str,
        fut: impl Future<Output = Result<T, FredError>>,
    ) -> Result<T, HarnessError> {
        self.at.bounded(op, fut).await
    }

    pub(super) async fn close(mut self) {
        let _ = tokio::time::timeout(QUIT_TIMEOUT, self.client.quit()).await;
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    pub(super) async fn config_get(&self, parameter: &str) -> Result<Option<String>, HarnessError> {
        let op = format!("CONFIG GET {parameter}");
        let reply: HashMap<String, String> = self
            .run(
                &op,
                self.client.custom(
                    CustomCommand::new_static("CONFIG", None, false),
                    vec!["GET", parameter],
                ),
            )
            .await?;
        Ok(reply.get(parameter).cloned())
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
