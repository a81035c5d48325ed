//! The workspace's integration tests, demo and README.
//!
//! This package publishes nothing. Its library exists so that the README's examples are
//! compiled as doc tests, with the guide's chapters (`docs/`); the README follows.
#![doc = include_str!("../README.md")]

// The guide's chapters (docs/), compiled as doc tests too so that their examples stay true.
// Only under `cfg(doctest)`: they are not part of this package's documentation.
#[cfg(doctest)]
#[doc = include_str!("../docs/getting-started.md")]
pub struct GettingStartedDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/locking.md")]
pub struct LockingDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/renewal.md")]
pub struct RenewalDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/several-keys-and-reentrancy.md")]
pub struct SeveralKeysAndReentrancyDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/semaphores.md")]
pub struct SemaphoresDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/read-write-locks.md")]
pub struct ReadWriteLocksDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/fair-hand-off.md")]
pub struct FairHandOffDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/fencing.md")]
pub struct FencingDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/production.md")]
pub struct ProductionDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/cli.md")]
pub struct CliDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/metrics-and-tracing.md")]
pub struct MetricsAndTracingDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/guarantees.md")]
pub struct GuaranteesDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/fault-lab.md")]
pub struct FaultLabDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/benchmarks.md")]
pub struct BenchmarksDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/architecture.md")]
pub struct ArchitectureDoctests;
