//! Exporting the locks' metrics to Prometheus: the libraries record through the `metrics`
//! facade, and the application installs the exporter it wants, here
//! `metrics-exporter-prometheus`, rendering the text exposition format itself (serve it on
//! your HTTP server's `/metrics`, or enable the exporter's own listener).
//!
//! Starts three lock nodes (real `redis-server` processes on free loopback ports), takes a
//! few locks (one won and renewed, one contended, one released) and prints what Prometheus
//! would scrape. Every metric is listed in the README's metrics table and in
//! `redlock_core::metrics`.
//!
//! Run it: `cargo run --example metrics`

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use redlock_client::{LockConfig, Redlock};
use redlock_testkit::NodeSet;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Install the recorder before connecting: metrics recorded earlier go nowhere, and the
    // first connect describes every metric (help text, unit) to the recorder installed then.
    let prometheus = PrometheusBuilder::new()
        // Histograms as buckets (without this the exporter renders summaries). Rounds on a
        // LAN take about a millisecond; waits behind a holder, up to seconds.
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_string()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ],
        )?
        .install_recorder()?;

    let nodes = NodeSet::start(3).await?;
    let config = LockConfig::builder()
        .nodes(nodes.urls())
        .ttl(Duration::from_millis(600))
        .build()?;
    let client = Redlock::connect(config).await?;

    let report = client.lock("reports:daily").await?;
    // Another caller finds it taken (one attempt, no waiting).
    let contended = client.try_lock("reports:daily").await;
    println!(
        "second try_lock: {}",
        if contended.is_ok() {
            "won?!"
        } else {
            "not acquired"
        }
    );
    // Held across a few renewals, then released.
    tokio::time::sleep(Duration::from_millis(500)).await;
    report.release().await?;
    let again = client.lock("reports:daily").await?;
    again.release().await?;
    client.shutdown().await;

    let exposition = prometheus.render();
    println!("{exposition}");
    if contended.is_ok()
        || !exposition.contains("redlock_acquisitions_total{outcome=\"acquired\"} 2")
    {
        return Err("the exposition does not count the acquisitions made".into());
    }
    Ok(())
}
