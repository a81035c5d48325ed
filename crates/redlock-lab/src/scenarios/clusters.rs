//! Cluster members: quorum members that are whole Redis Clusters, beside single servers
//! (local processes only, see `Setup::clusters`). Their clients reach them straight, so
//! their faults are the processes' (paused, failed over), not the links'. Plain cycles on
//! the one key: the observer samples it on the master of its slot.
//!
//! Two must-pass scenarios (a shard failing over under load with `replica_acks`, a member
//! cut off) and one demonstration: without `replica_acks`, a majority of members failing
//! over at once, each losing the holder's key, admits a second holder.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_testkit::{ClusterShape, Failover};

use super::demos::{demo, OVERLAP};
use super::steal::{hold_then_steal, Break};
use super::{at, contend_under};
use crate::backend::Setup;
use crate::error::LabError;
use crate::lab::{Fencing, Lab, Timing};
use crate::resource::Resource;
use crate::scenario::{Expect, Outcome, Scenario, KEY};

/// A cluster member's commands go to several processes on a shared host, and a
/// `replica_acks` one waits for its replica: a node timeout with room for both.
const TIMING: Timing = Timing {
    ttl: Duration::from_secs(1),
    node_timeout: Duration::from_millis(200),
    run_for: Duration::from_secs(4),
};

/// One cluster of two shards, each with a replica that must acknowledge every acquisition
/// and extension, and two single servers.
const SHARDS_WITH_REPLICAS: Setup = Setup {
    nodes: 3,
    persistent: false,
    fake_clock: false,
    clusters: &[ClusterShape {
        masters: 2,
        replicas: 1,
        replica_acks: 1,
    }],
};

/// One cluster of two shards without replicas, and two single servers.
const SHARDS: Setup = Setup {
    clusters: &[ClusterShape {
        masters: 2,
        replicas: 0,
        replica_acks: 0,
    }],
    ..SHARDS_WITH_REPLICAS
};

/// Two clusters of one shard with a replica each, no `replica_acks`, and a single server.
const TWO_CLUSTERS: Setup = Setup {
    clusters: &[
        ClusterShape {
            masters: 1,
            replicas: 1,
            replica_acks: 0,
        },
        ClusterShape {
            masters: 1,
            replicas: 1,
            replica_acks: 0,
        },
    ],
    ..SHARDS_WITH_REPLICAS
};

fn safe(
    name: &'static str,
    shows: &'static str,
    setup: Setup,
    run: crate::scenario::Driver,
) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Safe,
        setup,
        clients: 3,
        fencing: Fencing::Off,
        timing: TIMING,
        soak: None,
        semaphore: None,
        rwlock: false,
        run,
    }
}

pub(super) fn must_pass() -> Vec<Scenario> {
    vec![
        safe(
            "cluster_shard_fails_over",
            "the shard of a cluster member that serves the key fails over (FORCE) while three clients contend, with replica_acks = 1; members: the cluster and two single servers",
            SHARDS_WITH_REPLICAS,
            cluster_shard_fails_over,
        ),
        safe(
            "cluster_member_cut_off",
            "a whole cluster member (every process paused) is cut off for two seconds while three clients contend: the two single servers carry the quorum, and what the cluster runs late is rolled back",
            SHARDS,
            cluster_member_cut_off,
        ),
    ]
}

pub(super) fn demos() -> Vec<Scenario> {
    vec![Scenario {
        setup: TWO_CLUSTERS,
        timing: Timing {
            // The failovers take a second or two: the holder's validity must outlast them
            // for the second holder to overlap. Nothing waits this TTL out.
            ttl: Duration::from_secs(10),
            ..TIMING
        },
        ..demo(
            "cluster_majority_fails_over",
            "H2 on cluster members: a member keeps what it granted through a failover only with replica_acks",
            OVERLAP,
            "two of three members are clusters of one master and a replica, without replica_acks; their replication is held back, client 0 takes the lock, both replicas take over (TAKEOVER) without the key, and client 1 wins on both while client 0 still holds",
            cluster_majority_fails_over,
        )
    }]
}

fn cluster_shard_fails_over(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        tokio::time::sleep(at(lab, 0.25)).await;
        let shard = match lab.backend.cluster(0) {
            Some(cluster) => cluster.shard_of(&lab.full_key(KEY)),
            None => return Err(LabError::Setup("member 0 is not a cluster".into())),
        };
        lab.fail_over(0, shard, Failover::Force).await
    }))
}

fn cluster_member_cut_off(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(contend_under(lab, 3, async {
        tokio::time::sleep(at(lab, 0.125)).await;
        lab.partition(0).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        lab.heal(0).await
    }))
}

fn cluster_majority_fails_over(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let resource = Resource::default();
        hold_then_steal(lab, Break::ClusterFailovers, &resource).await
    })
}
