//! A node's URL: the schemes a node may use, and the name it is reported under (its
//! password masked).

use crate::error::ConfigError;
use crate::report::NodeName;

/// A node URL that passed the checks, with the name it is reported under.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) name: NodeName,
    pub(crate) fred: fred::types::config::Config,
    /// A cluster member's own `replica_acks=N`, which overrides `Config::replica_acks`
    /// for it (see [`member_replica_acks`]).
    pub(crate) replica_acks: Option<u32>,
}

/// Only the name: fred's `Config` prints its password as given.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

pub(super) fn parse_node(url: &str) -> Result<Endpoint, ConfigError> {
    let trimmed = url.trim();
    if trimmed.is_empty() {
        return Err(ConfigError::InvalidUrl {
            url: String::new(),
            reason: "the URL is empty".into(),
        });
    }
    let name = NodeName::redacted(trimmed);
    let invalid = |reason: String| ConfigError::InvalidUrl {
        url: name.to_string(),
        reason,
    };
    let parsed = url::Url::parse(trimmed).map_err(|e| invalid(e.to_string()))?;
    if parsed.port() == Some(0) {
        return Err(invalid(
            "port 0 is no server's port: give the port the Redis master listens on \
             (6379 when omitted)"
                .into(),
        ));
    }
    match parsed.scheme() {
        "redis" | "valkey" | "redis-cluster" | "valkey-cluster" => {}
        "rediss" | "valkeys" | "rediss-cluster" | "valkeys-cluster" if cfg!(feature = "tls") => {}
        "rediss" | "valkeys" | "rediss-cluster" | "valkeys-cluster" => {
            return Err(invalid("TLS URLs need redlock-core's `tls` feature".into()));
        }
        "redis+unix" | "valkey+unix" if cfg!(feature = "unix-sockets") => {}
        "redis+unix" | "valkey+unix" => {
            return Err(invalid(
                "unix socket URLs need redlock-core's `unix-sockets` feature".into(),
            ));
        }
        other => {
            return Err(invalid(format!(
                "unsupported scheme `{other}`: a member is a standalone master, written \
                 redis://host:port, or a whole cluster, written \
                 redis-cluster://host:port?node=host2:port2 (no sentinel URLs)"
            )));
        }
    }
    let fred = fred::types::config::Config::from_url(trimmed)
        .map_err(|e| invalid(e.details().to_string()))?;
    if fred.server.is_sentinel() {
        return Err(invalid(
            "Redlock needs standalone masters or clusters, not a sentinel set".into(),
        ));
    }
    // fred reads `node=` seeds only under a `-cluster` scheme, and ignores them otherwise.
    if !fred.server.is_clustered() && parsed.query_pairs().any(|(name, _)| name == "node") {
        return Err(invalid(format!(
            "`node=` seeds name the other nodes of a cluster: write the URL as \
             {}-cluster://..., or drop them for a single server",
            parsed.scheme()
        )));
    }
    let replica_acks = member_replica_acks(&parsed, fred.server.is_clustered()).map_err(invalid)?;
    Ok(Endpoint {
        name,
        fred,
        replica_acks,
    })
}

/// A cluster member's `replica_acks=N` query parameter: how many replicas must
/// acknowledge its writes, for this member only, over `Config::replica_acks`. Members of
/// one lock may differ: a cluster with replicas beside one without (which could never
/// acknowledge), or one whose replicas are far away. Only a cluster URL takes it (fred
/// ignores it): a single server has no replicas to wait for.
fn member_replica_acks(url: &url::Url, cluster: bool) -> Result<Option<u32>, String> {
    let mut given = url
        .query_pairs()
        .filter(|(name, _)| name == "replica_acks")
        .map(|(_, value)| value.into_owned());
    let Some(value) = given.next() else {
        return Ok(None);
    };
    if given.next().is_some() {
        return Err("`replica_acks=` is given more than once: give it once".into());
    }
    if !cluster {
        return Err(format!(
            "`replica_acks=` is for a member that is a whole cluster (how many replicas of \
             its master acknowledge each write); a single server has none to wait for: drop \
             it, or write the URL as {}-cluster://...",
            url.scheme()
        ));
    }
    value.parse().map(Some).map_err(|_| {
        format!("`replica_acks={value}` is not a number of replicas: write, for example, `replica_acks=1`")
    })
}
