//! A lock kind that only tests have, added in this one file (and its line in `kind::all`)
//! to show that a kind needs nothing else: it runs through the acquisition, fenced and in a
//! fair queue, the extension and the release against real servers. Its key holds
//! `"<label>=<token>"`, the label being the kind's argument, so that what the nodes hold
//! shows that its own Lua ran.

use std::sync::LazyLock;

use super::{Kind, KindScripts};

pub(crate) struct Labelled;

pub(crate) static LABELLED: Labelled = Labelled;

const LUA: &str = r#"local function take(first, last, token, ttl, label)
  if redis.call("SET", KEYS[first], label .. "=" .. token, "NX", "PX", ttl) then return true end
  return false
end
local function held(first, last, token, ttl, waiter, label) return false end
local function free(key, token, label)
  if redis.pcall("GET", key) ~= label .. "=" .. token then return false, false end
  redis.call("DEL", key)
  return true, true
end
local function holds(key, token, label)
  return redis.pcall("GET", key) == label .. "=" .. token
end"#;

static SCRIPTS: LazyLock<KindScripts> = LazyLock::new(|| KindScripts::of(&LABELLED));

impl Kind for Labelled {
    fn name(&self) -> &'static str {
        "labelled (tests only)"
    }
    fn tag(&self) -> &'static str {
        "t"
    }
    fn lua(&self) -> &'static str {
        LUA
    }
    fn has_arg(&self) -> bool {
        true
    }
    fn scripts(&self) -> &'static KindScripts {
        &SCRIPTS
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use redlock_testkit::{eventually, NodeSet};

    use super::*;
    use crate::config::Config;
    use crate::coordinator::Coordinator;
    use crate::error::Error;
    use crate::fair::FairPlace;
    use crate::layout::queue_keys;
    use crate::lock_spec::LockSpec;
    use crate::token::Token;

    const TTL: Duration = Duration::from_secs(10);
    const KEY: &str = "seam";

    fn spec(token: &Token, fair: bool) -> LockSpec {
        let mut spec =
            LockSpec::of_kind(&LABELLED, &[KEY], token.clone(), Some(Arc::from("blue"))).unwrap();
        spec.fair = fair;
        spec
    }

    /// What each node holds under the key (`None` where it has nothing).
    async fn held(set: &NodeSet) -> Vec<Option<String>> {
        let mut held = Vec::new();
        for node in set.iter() {
            held.push(node.get(KEY).await.unwrap());
        }
        held
    }

    /// Waits until every node holds `value` under the key: a round returns once its quorum
    /// is in, and the last node may still be answering.
    async fn settles(set: &NodeSet, value: Option<String>) {
        let every = vec![value; set.len()];
        eventually(Duration::from_secs(5), || async {
            held(set).await == every
        })
        .await;
        assert_eq!(held(set).await, every);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kind_added_in_one_file_runs_through_every_protocol() {
        let set = NodeSet::start(3).await.unwrap();
        let config = Config {
            nodes: set.urls(),
            release_channel: Some("redlock:released".to_string()),
            // A second per node: on a loaded machine every round must still reach all three.
            node_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let queue = queue_keys(&config.fair_prefix, KEY)[0]
            .as_str()
            .unwrap()
            .to_string();
        let c = Coordinator::connect(config).await.unwrap();
        let first = Token::random();
        let lock = c
            .acquire_spec(spec(&first, false), TTL, None, false, None)
            .await
            .unwrap();
        settles(&set, Some(format!("blue={}", first.as_str()))).await;

        let extended = c.extend(&lock, Duration::from_secs(60)).await.unwrap();
        assert!(extended.valid_until() > lock.valid_until());
        for node in set.iter() {
            assert!(node.pttl(KEY).await.unwrap() > 30_000, "{}", node.name());
        }

        // A fair waiter is refused while the lock is held, and queues on every node.
        let second = Token::random();
        let place = FairPlace::now("t:waiter", Duration::from_secs(5));
        let refused = c
            .acquire_spec(spec(&second, true), TTL, Some(place), false, None)
            .await;
        assert!(
            matches!(refused, Err(Error::NoQuorum { .. })),
            "{refused:?}"
        );
        for node in set.iter() {
            assert!(node.exists(&queue).await.unwrap(), "{}", node.name());
        }

        // The release frees the key; the waiter, head of the queue, takes it and leaves.
        c.release(&extended).await.unwrap();
        settles(&set, None).await;
        let won = c
            .acquire_spec(spec(&second, true), TTL, Some(place), false, None)
            .await
            .unwrap();
        settles(&set, Some(format!("blue={}", second.as_str()))).await;
        eventually(Duration::from_secs(5), || async {
            set.nodes_holding(&queue).await.is_empty()
        })
        .await;
        assert_eq!(set.nodes_holding(&queue).await, Vec::<usize>::new());
        c.release(&won).await.unwrap();

        // Fenced: the counter is read in the acquisition's own call.
        let third = Token::random();
        let fenced = c
            .acquire_spec(spec(&third, false), TTL, None, true, None)
            .await
            .unwrap();
        assert!(fenced.fencing_token().is_some());
        settles(&set, Some(format!("blue={}", third.as_str()))).await;
        c.release(&fenced).await.unwrap();
        settles(&set, None).await;
    }
}
